"""hoist_gradients: grouped-GEMM weight gradients run as soon as their operands exist, when that frees bytes earlier."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import SmallMoe
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

import trex
from trex.ops import moe_decompositions  # noqa: F401 - registers the extern grouped GEMMs
from trex.pass_manager import PassContext
from trex.passes import CpuGemmPrecision, DecomposeMoe, HoistGradients
from trex.passes.hoist_gradients import live_bytes

ops = torch.ops.trex


def _backward_like(rows: int, hidden: int, groups: int, dtype: torch.dtype = torch.bfloat16):
    """A graph shaped like one MoE layer's expert backward as AOTAutograd emits it: the data gradient and what
    reads it first, the weight gradient (a graph output) last, its operands produced early. In bf16 the weight
    gradient is what passes.cpu_gemm_precision makes of it (`trex.extern_aten_grouped_mm`, per-group fp32
    working copies); in fp32 the plain extern GEMM."""

    def backward(activation, grad, weight, offsets):
        grad_rows = grad * 3  # the operands' producers
        rows_in = activation + 1
        data_grad = ops.extern_grouped_mm(grad_rows, weight.transpose(1, 2), offsets)
        downstream = data_grad.sin() * 2
        if dtype == torch.float32:
            weight_grad = ops.extern_grouped_mm_weight_grad(rows_in, grad_rows, offsets)
        else:
            weight_grad = ops.extern_aten_grouped_mm(rows_in.t(), grad_rows, offsets)
        return downstream, weight_grad

    generator = torch.Generator().manual_seed(0)
    inputs = (
        torch.randn(rows, hidden, generator=generator).to(dtype),
        torch.randn(rows, hidden, generator=generator).to(dtype),
        torch.randn(groups, hidden, hidden, generator=generator).to(dtype),
        torch.tensor([rows // 4 * (g + 1) for g in range(groups - 1)] + [rows], dtype=torch.int32),
    )
    return make_fx(backward)(*inputs), inputs


def _order(gm: fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes]


def test_the_weight_gradient_moves_next_to_its_operands_when_that_frees_bytes_earlier():
    """64 rows x 16: the weight gradient's operands (4 KiB each, read by nothing after it) outweigh its output
    (4 x 16 x 16 fp32, 4 KiB): it moves before the data gradient, the simulated live bytes over the interval do
    not rise anywhere and fall on average, and the graph computes exactly what it did."""
    gm, inputs = _backward_like(rows=64, hidden=16, groups=4)
    expected = gm(*inputs)
    before = live_bytes(list(gm.graph.nodes))
    result = HoistGradients().run(gm, PassContext(phase="backward"))
    assert result.modified and [d.action for d in result.decisions] == ["hoist"]
    order = _order(gm)
    weight_grad = next(n.name for n in gm.graph.nodes if n.target is ops.extern_aten_grouped_mm.default)
    data_grad = next(n.name for n in gm.graph.nodes if n.target is ops.extern_grouped_mm.default)
    assert order.index(weight_grad) < order.index(data_grad)
    after = live_bytes(list(gm.graph.nodes))
    assert max(after) <= max(before) and sum(after) < sum(before)
    peak, mean = result.decisions[0].data["peak_live_bytes"], result.decisions[0].data["mean_live_bytes"]
    assert peak[1] <= peak[0] and mean[1] < mean[0]
    for got, want in zip(gm(*inputs), expected):
        assert torch.equal(got, want)


def test_a_weight_gradient_without_working_copies_stays_where_it_is():
    """The same graph in fp32: the weight gradient allocates only its output, so it is kept in place (moving
    it changed how Inductor fused the layers' backward kernels: more C++ kernels to build), and the decision
    says why."""
    gm, _ = _backward_like(rows=64, hidden=16, groups=4, dtype=torch.float32)
    order = _order(gm)
    result = HoistGradients().run(gm, PassContext(phase="backward"))
    assert not result.modified and _order(gm) == order
    assert [d.action for d in result.decisions] == ["keep"] and "working copies" in result.decisions[0].reason


def test_a_move_that_would_hold_more_bytes_is_not_made():
    """16 rows x 16 with 16 groups: the output (16 KiB) outweighs the operands it would free (1 KiB each)."""
    gm, _ = _backward_like(rows=16, hidden=16, groups=16)
    order = _order(gm)
    result = HoistGradients().run(gm, PassContext(phase="backward"))
    assert not result.modified and _order(gm) == order


def test_only_backward_graphs_are_reordered():
    gm, _ = _backward_like(rows=64, hidden=16, groups=4)
    order = _order(gm)
    for phase in ("forward", "inference", "joint"):
        assert not HoistGradients().run(gm, PassContext(phase=phase)).modified
    assert _order(gm) == order


def test_live_bytes_counts_views_once_and_frees_values_at_their_last_reader():
    """x (placeholder, 64 B) is read last by `view`'s reader, y = x.view(...) owns nothing, z = y * 2 (64 B)
    is the output: x is alive through z, z to the end."""

    def f(x):
        return (x.view(4, 4) * 2,)

    gm = make_fx(f)(torch.randn(16))
    names = _order(gm)
    curve = dict(zip(names, live_bytes(list(gm.graph.nodes))))
    assert curve[names[0]] == 64  # the input
    view, mul = names[1], names[2]
    assert curve[view] == 64 and curve[mul] == 128


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_moe_backward_computes_the_same_gradients_with_its_weight_gradients_hoisted(dtype):
    """Two MoE layers, 96 tokens, the MoE primitives decomposed (the bf16 grouped GEMMs upcast per expert), once
    without the pass and once with it: in bf16 weight gradients move up, in fp32 they stay; every gradient is
    bit-equal."""
    native = CpuGemmPrecision(native={torch.bfloat16, torch.float16}, measure=False)  # grouped GEMMs upcast on any CPU
    pipeline = ["canonicalize_moe", DecomposeMoe(force=True), native]
    grads, decisions = {}, {}
    for hoisted in (False, True):
        torch.manual_seed(0)
        model, x = SmallMoe().to(dtype), torch.randn(96, 16).to(dtype)
        compiled = trex.compile(
            copy.deepcopy(model), backend="eager", passes=pipeline + (["hoist_gradients"] if hoisted else [])
        )
        compiled(x).backward()
        grads[hoisted] = [p.grad for p in compiled.parameters()]
        records = [r for g in compiled.trex.graphs for r in g.report.records if r.name == "hoist_gradients"]
        decisions[hoisted] = [d for r in records for d in r.decisions]
    moved = [d for d in decisions[True] if d.action == "hoist"]
    if dtype == torch.float32:
        assert decisions[True] and not moved and all(d.action == "keep" for d in decisions[True])
    else:
        assert moved and all(d.data["graph"] == "backward" for d in moved)
    for got, want in zip(grads[True], grads[False]):
        assert torch.equal(got, want)
