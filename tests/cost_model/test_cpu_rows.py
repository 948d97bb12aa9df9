"""CPU row-wise kernels: softmax rows shorter than a SIMD vector run scalar, reductions pay per output."""

import dataclasses

import pytest
import torch

from trex.cost_model.annotate import annotate
from trex.cost_model.catalog import get_cluster
from trex.cost_model.cpu_rows import reduction_outputs, scalar_softmax_elements
from trex.cost_model.devices import device_profile_from_dict, device_profile_to_dict, get_device
from trex.errors import TrexError

aten = torch.ops.aten


def _graph(op, *example):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode() as mode:
        return make_fx(op)(*[mode.from_tensor(t) for t in example])


def _node(graph, name):
    return next(n for n in graph.graph.nodes if n.op == "call_function" and str(n.target).startswith(name))


def test_a_softmax_over_rows_shorter_than_a_vector_runs_all_its_elements_scalar():
    short = _graph(lambda x: aten._softmax(x, -1, False), torch.rand(512, 8))
    assert scalar_softmax_elements(_node(short, "aten._softmax"), "aten._softmax", 16) == (4096.0, "forward")
    assert scalar_softmax_elements(_node(short, "aten._softmax"), "aten._softmax", 8) == (
        0.0,
        "",
    )  # a full vector per row
    assert scalar_softmax_elements(_node(short, "aten._softmax"), "aten._softmax", 0) == (0.0, "")  # not modelled
    # over an outer dimension the kernel vectorises across the rows instead
    outer = _graph(lambda x: aten._softmax(x, 0, False), torch.rand(8, 512))
    assert scalar_softmax_elements(_node(outer, "aten._softmax"), "aten._softmax", 16) == (0.0, "")
    backward = _graph(
        lambda g, y: aten._softmax_backward_data(g, y, -1, torch.float32), torch.rand(256, 2), torch.rand(256, 2)
    )
    assert scalar_softmax_elements(_node(backward, "aten._softmax_backward"), "aten._softmax_backward_data", 16) == (
        512.0,
        "backward",
    )


def test_a_reduction_counts_its_outputs_and_whether_it_reads_contiguous_rows():
    pairs = _graph(lambda x: aten.sum.dim_IntList(x, [-1], True), torch.rand(1024, 2))
    assert reduction_outputs(_node(pairs, "aten.sum"), "aten.sum") == (1024.0, "contiguous")
    middle = _graph(lambda x: aten.sum.dim_IntList(x, [1], True), torch.rand(512, 2, 2))
    assert reduction_outputs(_node(middle, "aten.sum"), "aten.sum") == (1024.0, "strided")
    # a transposed input's innermost dimension in memory is its first
    along = _graph(lambda x: aten.sum.dim_IntList(x.t(), [0], True), torch.rand(2, 1024))
    assert reduction_outputs(_node(along, "aten.sum"), "aten.sum") == (2.0, "contiguous")
    across = _graph(lambda x: aten.sum.dim_IntList(x.t(), [1], True), torch.rand(2, 1024))
    assert reduction_outputs(_node(across, "aten.sum"), "aten.sum") == (1024.0, "strided")
    full = _graph(lambda x: aten.sum.default(x), torch.rand(64, 64))
    assert reduction_outputs(_node(full, "aten.sum"), "aten.sum") == (1.0, "contiguous")


def _time(graph, profile) -> float:
    annotate(graph, get_cluster("cpu").with_device(profile))
    return sum(n.meta["cost"].time_s for n in graph.graph.nodes if "cost" in n.meta and n.meta["cost"].priced)


def test_annotate_charges_the_scalar_softmax_and_the_per_output_reduction_on_a_cpu_profile():
    plain = get_device("cpu")
    profile = dataclasses.replace(
        plain,
        vector_lanes=16,
        scalar_softmax_ns={"forward": 18.0, "backward": 6.0},
        reduce_output_ns={"contiguous": 4.0, "strided": 10.0},
    )
    router = _graph(lambda x: aten._softmax(x, -1, False), torch.rand(512, 8))
    assert _time(router, profile) - _time(router, plain) == pytest.approx(4096 * 18e-9)
    wide = _graph(lambda x: aten._softmax(x, -1, False), torch.rand(32, 128))  # same bytes, vector rows
    assert _time(wide, profile) == pytest.approx(_time(wide, plain))
    middle = _graph(lambda x: aten.sum.dim_IntList(x, [1], True), torch.rand(512, 2, 2))
    assert _time(middle, profile) - _time(middle, plain) == pytest.approx(1023 * 10e-9)
    # accelerators: no row costs, whatever the shapes
    h100 = get_cluster("h100", 8)
    annotate(router, h100)
    assert _node(router, "aten._softmax").meta["cost"].time_s == pytest.approx(
        h100.device.op_time("aten._softmax", "softmax", *_work(router))
    )


def _work(graph):
    cost = _node(graph, "aten._softmax").meta["cost"]
    return cost.flops, cost.bytes


def test_row_cost_tables_round_trip_and_are_validated():
    profile = dataclasses.replace(
        get_device("cpu"),
        vector_lanes=8,
        scalar_softmax_ns={"forward": 15.0, "backward": 5.0},
        reduce_output_ns={"contiguous": 3.0, "strided": 9.0},
    )
    data = device_profile_to_dict(profile)
    assert device_profile_from_dict(data) == profile
    data["device"]["scalar_softmax_ns"]["sideways"] = 1.0
    with pytest.raises(
        TrexError,
        match="'device.scalar_softmax_ns.sideways' is not a profile field; valid fields here: backward, forward",
    ):
        device_profile_from_dict(data)


def test_a_measured_grouped_gemm_costs_its_arithmetic_plus_its_measured_call_overhead():
    # the CPU grouped GEMM loops over its groups: calibration measures that fixed cost per call; the bytes
    # rate of the same calibration is not a bound for a GEMM (it would price 1024 rows at several times the mm)
    import trex.ops  # noqa: F401

    plain = get_device("cpu")
    profile = dataclasses.replace(
        plain,
        op_overhead_us={**plain.op_overhead_us, "trex.grouped_mm": 25.0},
        op_bandwidth_gbs={**plain.op_bandwidth_gbs, "trex.grouped_mm": 0.5},
    )
    graph = _graph(
        lambda x, w, o: torch.ops.trex.grouped_mm(x, w, o),
        torch.rand(1024, 64),
        torch.rand(8, 64, 64),
        torch.arange(128, 1025, 128, dtype=torch.int32),
    )
    seconds = _time(graph, profile)
    # the measured call already holds its per-group launches (one mm per group on a CPU): the model's launches
    # beyond one call's are taken out, not counted twice
    extra_launches = profile.gemm_launch_s("fp32", 8) - profile.gemm_launch_s("fp32")
    assert extra_launches > 0  # the cpu profile issues a grouped GEMM as one call per group
    assert seconds == pytest.approx(profile.gemm_time(128, 64, 64, "fp32", 8) - extra_launches + 25e-6)
