"""CPU element-wise kernels: TensorIterator's rows and 2-D loop calls, and what annotate charges for them."""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from trex.cost_model.annotate import annotate
from trex.cost_model.catalog import get_cluster
from trex.cost_model.cpu_loops import tensor_iterator_loops
from trex.cost_model.devices import get_device


def _layout(t: torch.Tensor):
    return tuple(t.shape), t.stride()


def test_contiguous_operands_coalesce_into_one_row():
    x = torch.empty(2, 256, 64)
    assert tensor_iterator_loops([_layout(x), _layout(x)]) == (1, 1)


def test_a_broadcast_of_the_last_dimension_costs_a_row_per_outer_index():
    x, column = torch.empty(512, 64), torch.empty(512, 1)
    assert tensor_iterator_loops([_layout(x), _layout(column)]) == (512, 1)  # rows of 64, one 2-D call


def test_rows_that_do_not_chain_are_walked_one_by_one():
    wide = torch.empty(1024, 4)
    assert tensor_iterator_loops([_layout(wide[:, :2]), _layout(wide[:, :2])]) == (1024, 1)


def test_a_broadcast_over_a_middle_dimension_breaks_the_second_dimension_too():
    cube, middle = torch.empty(512, 2, 2), torch.empty(512, 1, 2)
    assert tensor_iterator_loops([_layout(cube), _layout(middle)]) == (1024, 512)


def test_a_transposed_input_is_walked_in_its_own_memory_order():
    x = torch.empty(64, 32).t()  # (32, 64) with strides (1, 32)
    assert tensor_iterator_loops([_layout(x)]) == (1, 1)  # alone it is contiguous, in the other order
    # with a row-major partner: the first input's order wins, 64 rows of its 32 contiguous elements
    assert tensor_iterator_loops([_layout(x), _layout(torch.empty(32, 64))]) == (64, 1)


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@given(shapes, st.data())
def test_rows_and_calls_are_bounded_by_the_elements(shape, data):
    base = torch.empty(*shape)
    order = data.draw(st.permutations(range(len(shape))))
    permuted = base.permute(*order)
    operands = [_layout(permuted), _layout(torch.empty(*permuted.shape))]
    rows, calls = tensor_iterator_loops(operands)
    assert 1 <= calls <= rows <= permuted.numel()
    assert tensor_iterator_loops([_layout(permuted)]) == (1, 1)  # one dense tensor always coalesces


def _tiny_graph(op, *example):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in example]
        return make_fx(op)(*fakes)


def _time(graph, profile) -> float:
    cluster = get_cluster("cpu").with_device(profile)
    annotate(graph, cluster)
    return sum(n.meta["cost"].time_s for n in graph.graph.nodes if "cost" in n.meta and n.meta["cost"].priced)


def test_annotate_charges_the_loops_of_a_broken_layout_on_a_cpu_profile():
    profile = dataclasses.replace(get_device("cpu"), row_overhead_ns=2.5, loop_call_overhead_ns=18.0)
    contiguous = _tiny_graph(torch.div, torch.rand(2048), torch.rand(2048))
    broadcast = _tiny_graph(torch.div, torch.rand(512, 2, 2), torch.rand(512, 1, 2))
    extra = _time(broadcast, profile) - _time(contiguous, profile)
    assert extra == pytest.approx((1023 * 2.5 + 511 * 18.0) * 1e-9, rel=0.05)


def test_accelerator_profiles_pay_no_loop_overheads():
    h100 = get_device("h100")
    assert h100.row_overhead_ns == h100.loop_call_overhead_ns == 0.0
    broadcast = _tiny_graph(torch.div, torch.rand(512, 2, 2), torch.rand(512, 1, 2))
    contiguous = _tiny_graph(torch.div, torch.rand(2048), torch.rand(2048))
    assert _time(broadcast, h100) <= _time(contiguous, h100)  # it moves fewer bytes, and nothing else counts


def test_a_python_number_operand_uses_its_own_measured_fixed_cost():
    profile = dataclasses.replace(
        get_device("cpu"), op_overhead_us={"aten.add.Tensor": 1.5, "aten.add.Tensor[scalar]": 3.3}
    )
    tensor = _tiny_graph(torch.add, torch.rand(8), torch.rand(8))
    scalar = _tiny_graph(lambda x: torch.add(x, 0.5), torch.rand(8))
    assert _time(scalar, profile) - _time(tensor, profile) == pytest.approx(1.8e-6, rel=0.05)
