"""`backends.inductor.zero_fills`: a narrow scatter-add into zeros becomes sums over its index slots with the
scatter-add's values, and nothing else is rewritten."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from trex.backends.inductor.zero_fills import MAX_SLOTS, scatter_adds_as_slot_sums

aten = torch.ops.aten


def _router_gather_backward(index, grad):
    """What the backward of `scores.gather(-1, index)` is: a scatter-add into zeros."""
    return aten.scatter_add.default(torch.zeros(index.size(0), 8, dtype=grad.dtype), 1, index, grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_scatter_add_into_zeros_becomes_slot_sums_with_its_values(dtype):
    torch.manual_seed(0)
    index = torch.stack([torch.randperm(8)[:3] for _ in range(16)])  # distinct per row, as top-k indices are
    index[1] = torch.tensor([5, 5, 2])  # a repeated index sums its entries
    grad = torch.randn(16, 3).to(dtype)
    grad[2, 1] = float("inf")  # stays in its own element
    gm = make_fx(_router_gather_backward, tracing_mode="fake")(index, grad)
    assert scatter_adds_as_slot_sums(gm) == ["scatter_add"]
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.scatter_add.default not in targets and aten.zeros.default not in targets
    expected = _router_gather_backward(index, grad)
    got = gm(index, grad)
    distinct = torch.ones(16, dtype=torch.bool)
    distinct[1] = False
    assert torch.equal(got[distinct], expected[distinct])  # one entry per element: exact
    torch.testing.assert_close(got[1], expected[1])  # two entries: the same sum, in slot order
    assert torch.isinf(got[2]).sum() == 1 and not torch.isnan(got).any()


def test_other_scatter_adds_are_left_alone():
    wide = torch.randint(0, 8, (4, MAX_SLOTS + 1))
    cases = [
        (
            lambda i, g: aten.scatter_add.default(torch.ones(4, 8), 1, i, g),
            (torch.randint(0, 8, (4, 2)), torch.randn(4, 2)),
        ),
        (
            lambda i, g: aten.scatter_add.default(torch.zeros(8, 4), 0, i, g),
            (torch.randint(0, 8, (2, 4)), torch.randn(2, 4)),
        ),
        (lambda i, g: aten.scatter_add.default(torch.zeros(4, 8), 1, i, g), (wide, torch.randn(wide.shape))),
    ]
    for fn, args in cases:  # a fill that is not zero; another dimension; more slots than MAX_SLOTS
        gm = make_fx(fn, tracing_mode="fake")(*args)
        assert scatter_adds_as_slot_sums(gm) == []
        assert torch.equal(gm(*args), fn(*args))


def test_the_slot_sums_are_in_the_form_inductor_lowers():
    """The new nodes need no decomposition of Inductor's: the region is not traced a second time."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import lowerings

    gm = make_fx(_router_gather_backward, tracing_mode="fake")(torch.randint(0, 8, (4, 2)), torch.randn(4, 2))
    scatter_adds_as_slot_sums(gm)
    table = select_decomp_table()
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert calls and not [t for t in calls if t in table and t not in lowerings]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_one_hot_scatter_becomes_a_pointwise_where_with_its_values(dtype):
    """`nll_loss`'s backward one-hot (`full(0).scatter(-1, target[:, None], -1.0)`) becomes `where`: no scatter
    buffer, exactly -1 at the target and 0 elsewhere, in the Inductor-lowerable form."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import lowerings

    def nll_backward_one_hot(target):
        return aten.scatter.value(torch.zeros(target.size(0), 10, dtype=dtype), 1, target, -1.0)

    target = torch.randint(0, 10, (6, 1))
    gm = make_fx(nll_backward_one_hot, tracing_mode="fake")(target)
    assert scatter_adds_as_slot_sums(gm) == ["scatter"]
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten.scatter.value not in calls
    table = select_decomp_table()
    assert not [t for t in calls if t in table and t not in lowerings]
    assert torch.equal(gm(target), nll_backward_one_hot(target))
    wide = torch.randint(0, 10, (6, 2))  # two indices per row: left alone
    gm = make_fx(lambda t: aten.scatter.value(torch.zeros(6, 10), 1, t, -1.0), tracing_mode="fake")(wide)
    assert scatter_adds_as_slot_sums(gm) == []
