"""decompose_moe: the MoE primitives' aten form computes what the primitives compute, forward and
backward, and the pass inlines it only when the leading backend asks (Inductor), leaving the
primitives to every other backend and pass that reads them."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings

import trex
from trex.ops import moe_decompositions as aten_form
from trex.pass_manager import PassContext
from trex.passes import CanonicalizeMoe, DecomposeMoe
from trex.testing import assert_pass_preserves_semantics, graphs

ops = torch.ops.trex
PRIMITIVES = {
    ops.grouped_mm.default,
    ops.grouped_mm_weight_grad.default,
    ops.moe_dispatch.default,
    ops.moe_combine.default,
    ops.moe_combine_backward.default,
    ops.moe_dispatch_backward.default,
}


def _routing(tokens=10, experts=5, top_k=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, experts, (tokens, top_k), generator=generator)  # repeats and empty experts too
    weights = torch.rand(tokens, top_k, generator=generator)
    return index, weights, generator


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_aten_form_of_every_primitive_equals_the_primitive(dtype):
    index, weights, generator = _routing()
    tokens, top_k = index.shape
    hidden = torch.randn(tokens, 8, generator=generator).to(dtype)
    sorted_hidden, perm, offsets = ops.moe_dispatch(hidden, index, 5)
    got_sorted, got_perm, got_offsets, inverse = aten_form.moe_dispatch(hidden, index, 5)
    torch.testing.assert_close(got_sorted, sorted_hidden, rtol=0, atol=0)
    assert torch.equal(got_perm, perm) and torch.equal(got_offsets, offsets) and got_offsets.dtype == torch.int32
    assert torch.equal(inverse[perm], torch.arange(perm.numel()))

    expert_out = torch.randn(tokens * top_k, 8, generator=generator).to(dtype)
    torch.testing.assert_close(
        aten_form.moe_combine(expert_out, inverse, weights), ops.moe_combine(expert_out, perm, weights), rtol=0, atol=0
    )
    grad_out = torch.randn(tokens, 8, generator=generator)
    expected = ops.moe_combine_backward(grad_out, expert_out, perm, weights)
    for got, want in zip(aten_form.moe_combine_backward(grad_out, expert_out, perm, inverse, weights), expected):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # k = 3: the per-token sum runs in slot order where the scatter-add ran in sorted-row order
    tolerance = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(
        aten_form.moe_dispatch_backward(expert_out, inverse, tokens),
        ops.moe_dispatch_backward(expert_out, perm, tokens),
        **tolerance,
    )


def test_grouped_gemms_use_aten_grouped_mm_in_bf16():
    index, _, generator = _routing(experts=4, top_k=2)
    rows = torch.randn(20, 8, generator=generator).bfloat16()
    _, _, offsets = ops.moe_dispatch(torch.randn(10, 8), index, 4)
    weight = torch.randn(4, 8, 16, generator=generator).bfloat16()  # aten._grouped_mm: 16-byte row strides
    torch.testing.assert_close(aten_form.grouped_mm(rows, weight, offsets), ops.grouped_mm(rows, weight, offsets))
    b = torch.randn(20, 16, generator=generator).bfloat16()
    torch.testing.assert_close(
        aten_form.grouped_mm_weight_grad(rows, b, offsets), ops.grouped_mm_weight_grad(rows, b, offsets)
    )
    assert aten_form.grouped_mm_decomposable(rows, weight)
    assert not aten_form.grouped_mm_decomposable(rows.float(), weight.float())  # its meta function is bf16-only
    # fp32: the autograd-free extern kernel, same values as the custom op
    rows, weight, b = rows.float(), weight.float(), b.float()
    torch.testing.assert_close(aten_form.grouped_mm(rows, weight, offsets), ops.grouped_mm(rows, weight, offsets))
    torch.testing.assert_close(
        aten_form.grouped_mm_weight_grad(rows, b, offsets), ops.grouped_mm_weight_grad(rows, b, offsets)
    )


@settings(max_examples=8)
@given(case=graphs(joint=True, require_moe=True))
def test_decomposition_preserves_semantics_on_random_joint_graphs(case):
    CanonicalizeMoe().run(case.gm, PassContext())
    case.gm.recompile()
    record = assert_pass_preserves_semantics(DecomposeMoe(force=True), case.gm, case.inputs)
    assert not PRIMITIVES & {n.target for n in case.gm.graph.nodes}
    assert all(d.action == "decompose" for d in record.decisions)
    for node in case.gm.graph.nodes:  # fp32 grouped GEMMs: the lean extern kernel (aten's meta is bf16-only)
        if node.target in (ops.extern_grouped_mm.default, ops.extern_grouped_mm_weight_grad.default):
            assert node.args[0].meta["val"].dtype != torch.bfloat16


def test_declines_unless_the_leading_backend_asks():
    graph = torch.fx.Graph()
    graph.output(graph.placeholder("x"))
    result = DecomposeMoe().run(torch.fx.GraphModule({}, graph), PassContext())
    assert not result.modified and result.decisions[0].action == "decline"


class _Moe(torch.nn.Module):
    def __init__(self, hidden=8, experts=4):
        super().__init__()
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * hidden, hidden) * hidden**-0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, hidden) * hidden**-0.5)

    def forward(self, x):
        weights, index = torch.topk(torch.softmax(self.router(x), -1), 3, dim=-1)
        return (
            torch.ops.trex.moe_experts(x, index, weights, self.gate_up, self.down, "silu", 0.0, False)[0] ** 2
        ).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_eager_backend_runs_the_decomposed_layer_like_the_primitives(dtype):
    """The pass on (forced) and off, run by the eager backend: same loss and gradients as eager."""
    torch.manual_seed(0)
    model, x = _Moe().to(dtype), torch.randn(12, 8, dtype=dtype)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend="eager", passes=["canonicalize_moe", DecomposeMoe(force=True)])
    loss = compiled(x)
    loss.backward()
    expected = reference(x)
    expected.backward()
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(loss, expected, **tolerance)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tolerance)
    graph = compiled.trex.graphs[0]
    targets = {n.target for g in (graph.forward, graph.backward) for n in g.graph.nodes}
    assert not PRIMITIVES & targets
    assert (ops.extern_grouped_mm.default in targets) == (dtype == torch.float32)
    # one inverse permutation per layer serves combine and both backward gathers: written into an unfilled
    # buffer (a permutation writes every element once), so Inductor fuses it into the dispatch's gather kernel
    moe_nodes = [n for n in graph.joint.graph.nodes if "trex_moe" in n.meta]
    aten = torch.ops.aten
    inverses = [n for n in moe_nodes if n.target in (aten.index_put.default, aten.index_put_.default)]
    assert len(inverses) == 1
    assert inverses[0].args[0].target in (aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default)
    # the expert offsets are a count, not an extern searchsorted over a materialised arange of the experts
    assert not any(n.target in (aten.scatter.src, aten.searchsorted.Tensor) for n in moe_nodes)
    # the combined tokens are saved for the backward, never recomputed there (a recomputed gather lands in a
    # different backward kernel per layer under Inductor): the partitioner's MUST_SAVE on the combine's output
    from torch.utils.checkpoint import CheckpointPolicy

    saved = [n for n in moe_nodes if n.meta.get("recompute") == CheckpointPolicy.MUST_SAVE]
    assert [tuple(n.meta["val"].shape) for n in saved] == [tuple(x.shape)]


def test_other_backends_keep_the_primitives():
    model, x = _Moe(), torch.randn(12, 8)
    compiled = trex.compile(model, backend="eager")
    compiled(x).backward()
    graph = compiled.trex.graphs[0]
    record = next(r for r in graph.report.records if r.name == "decompose_moe")
    assert not record.modified and record.decisions[0].action == "decline"
    targets = {n.target for g in (graph.forward, graph.backward) for n in g.graph.nodes}
    assert {ops.moe_dispatch.default, ops.moe_combine.default, ops.moe_combine_backward.default} <= targets


@pytest.mark.parametrize(
    "dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)], ids=["fp32", "bf16"]
)
def test_tiny_deepseek_v4_trains_like_eager_with_the_decomposition(dtype, step_matches_eager):
    """The default pipeline plus the decomposition (as under Inductor), run by the eager backend (no C++ compile)."""
    from trex.models import build_model, tiny_config
    from trex.passes import DEFAULT_PIPELINE

    config = tiny_config("deepseek-v4")
    model = build_model(config, dtype=dtype, seed=1)
    reference = copy.deepcopy(model)
    pipeline = [DecomposeMoe(force=True) if name == "decompose_moe" else name for name in DEFAULT_PIPELINE]
    compiled = trex.compile(model, backend="eager", passes=pipeline)
    step_matches_eager(compiled, model, reference, config, dtype)
    graph = compiled.trex.graphs[0]
    assert not PRIMITIVES & {n.target for g in (graph.forward, graph.backward) for n in g.graph.nodes}
