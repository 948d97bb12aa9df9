"""compute_once: broadcast-read transcendental values (the rotary cos/sin tables) computed once, not in every reader."""

from __future__ import annotations

import copy

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

import trex
import trex.ops.compute_once  # noqa: F401 - defines torch.ops.trex.compute_once
from trex.cost_model.op_formulas import power_flops_per_element
from trex.pass_manager import PassContext
from trex.passes import ComputeOnce
from trex.passes.compute_once import OPTION
from trex.testing.semantics import assert_pass_preserves_semantics

COMPUTE_ONCE = torch.ops.trex.compute_once.default


def _rotary_like(heads: int = 4, seq: int = 32, dim: int = 16, layers: int = 2, unary=torch.cos, batch: int = 4):
    """A graph shaped like a rotary embedding's use: positions x inverse frequencies -> cat -> cos (or another
    unary) -> x scaling, a `[1, S, D]` table read broadcast as `[B, H, S, D]` by the query and key products of
    every layer (what the tiny models' forward graphs hold). The keys have half the heads (grouped-query
    attention), and each layer's inputs come out of a GEMM on the previous layer's products, so no two readers
    can share a loop."""

    def program(positions, inv_freq, q, k, weight):
        freqs = positions[..., None].float() * inv_freq
        table = unary(torch.cat((freqs, freqs), dim=-1)) * 1.0
        shared = table.unsqueeze(1)
        outputs = []
        for _ in range(layers):
            q, k = torch.matmul(q * shared, weight), torch.matmul(k * shared, weight)
            outputs += [q, k]
        return tuple(outputs)

    generator = torch.Generator().manual_seed(0)
    inputs = (
        torch.arange(seq)[None],
        1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)),
        torch.randn(batch, heads, seq, dim, generator=generator),
        torch.randn(batch, max(1, heads // 2), seq, dim, generator=generator),
        torch.randn(dim, dim, generator=generator) / dim**0.5,
    )
    return make_fx(program, tracing_mode="fake")(*inputs), inputs


def _marked(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.target is COMPUTE_ONCE]


def _context(**options) -> PassContext:
    return PassContext(phase="forward", options={OPTION: True, **options})


def test_a_broadcast_cos_table_is_computed_once_and_the_values_do_not_change():
    """The `[1, 32, 16]` cos table read 48x per element by four `[4, 4 or 2, 32, 16]` products: one
    `trex.compute_once` on the scaled table (the last value before the fan-out), every reader on it, the outputs
    exactly the graph's, the decision with both predicted times (inlined above once)."""
    gm, inputs = _rotary_like()
    record = assert_pass_preserves_semantics(ComputeOnce(), gm, inputs, ctx=_context(), rtol=0, atol=0)
    (marked,) = _marked(gm)
    assert marked.args[0].target is torch.ops.aten.mul.Tensor  # the scaled table, not the cos before it
    assert all(user.args[0] is marked for user in marked.users)  # the unsqueeze reads the marked value
    (decision,) = [d for d in record.decisions if d.action == "compute_once"]
    assert decision.data["reads"] == 2 * (4 + 2) * 4 * 32 * 16 and decision.data["readers"] == 4
    assert decision.data["once_s"] < decision.data["inlined_s"]


def test_cheap_arithmetic_and_unshared_values_stay_inlined():
    """A chain without a transcendental (x 2 instead of cos) is what a code generator is right to inline: no
    mark. Nor is a cos read element for element (no broadcast): the backend's own reuse heuristics see it."""
    gm, inputs = _rotary_like(unary=lambda x: x * 2)
    assert_pass_preserves_semantics(ComputeOnce(), gm, inputs, ctx=_context(), rtol=0, atol=0)
    assert _marked(gm) == []

    def unshared(x):
        y = torch.cos(x) * 3
        return y + 1, y * 2

    gm = make_fx(unshared, tracing_mode="fake")(torch.randn(64, 64))
    ComputeOnce().run(gm, _context())
    assert _marked(gm) == []


def test_it_declines_unless_the_leading_backend_inlines_pointwise_values():
    gm, _ = _rotary_like()
    result = ComputeOnce().run(gm, PassContext(phase="forward"))
    assert not result.modified and _marked(gm) == []
    assert "inlines_pointwise_into_consumers" in result.decisions[0].reason
    assert ComputeOnce(force=True).run(gm, PassContext(phase="forward")).modified


def test_a_value_a_graph_output_reads_is_left_alone():
    """A table the forward returns (saved for the backward) is a buffer anyway - Inductor realizes what a graph
    output reads - so it is not marked, although its broadcast readers would otherwise make it a candidate; the
    same table unreturned is marked."""

    def program(positions, q, k, returned):
        table = torch.sin(positions[..., None].float() * torch.ones(16)) * 1.0
        return (q * table, k * table, table) if returned else (q * table, k * table)

    args = (torch.arange(32)[None], torch.randn(4, 8, 32, 16), torch.randn(4, 8, 32, 16))
    for returned, marks in ((True, 0), (False, 1)):
        gm = make_fx(lambda *a, r=returned: program(*a, r), tracing_mode="fake")(*args)
        ComputeOnce().run(gm, _context())
        assert len(_marked(gm)) == marks, returned


@settings(deadline=None)
@given(
    heads=st.sampled_from([2, 4, 8]),
    seq=st.sampled_from([4, 16, 32]),
    dim=st.sampled_from([4, 8, 16]),
    layers=st.integers(1, 3),
    unary=st.sampled_from([torch.sin, torch.cos, torch.exp, torch.tanh, torch.sigmoid, lambda x: x * 2 + 1]),
)
def test_any_rotary_like_graph_computes_the_same_values_and_every_mark_is_priced_cheaper(
    heads, seq, dim, layers, unary
):
    """Hypothesis-drawn tables, readers and unaries (transcendental or not): the outputs are bit-identical, every
    mark sits on a value with a transcendental in its chain and a broadcast reader, and its decision prices
    computing it once below inlining it."""
    gm, inputs = _rotary_like(heads=heads, seq=seq, dim=dim, layers=layers, unary=unary)
    record = assert_pass_preserves_semantics(ComputeOnce(), gm, inputs, ctx=_context(), rtol=0, atol=0)
    marks = [d for d in record.decisions if d.action == "compute_once"]
    assert len(marks) == len(_marked(gm))
    for decision in marks:
        assert decision.data["once_s"] < decision.data["inlined_s"]
        assert decision.data["reads"] > decision.data["numel"]
    if unary not in (torch.sin, torch.cos, torch.exp, torch.tanh, torch.sigmoid):
        assert marks == []


def test_inductor_evaluates_a_marked_table_once():
    """Lowered by trex's Inductor backend, the marked table is one kernel's buffer: the generated C++ evaluates
    cos in one kernel instead of in each reader's, and the outputs equal eager's."""
    from torch._inductor.utils import run_and_get_code

    from trex.backends.inductor import InductorBackend

    def kernels_with_cos(gm, inputs):
        examples = [p.meta["val"] for p in gm.graph.find_nodes(op="placeholder")]
        outputs, (code, *_) = run_and_get_code(lambda: InductorBackend().lower(gm, examples)(*inputs))
        kernels = code.split("cpp_fused")[1:]
        return outputs, sum(".cos()" in kernel or "std::cos" in kernel for kernel in kernels)

    gm, inputs = _rotary_like(layers=2)
    expected = gm(*inputs)
    plain_outputs, plain = kernels_with_cos(gm, inputs)
    gm, _ = _rotary_like(layers=2)
    ComputeOnce().run(gm, _context())
    marked_outputs, marked = kernels_with_cos(gm, inputs)
    assert plain > 1 and marked == 1, (plain, marked)
    for actual in (plain_outputs, marked_outputs):
        torch.testing.assert_close(list(actual), list(expected), rtol=1e-5, atol=1e-6)


def test_the_cost_model_prices_trig_and_integral_powers_by_what_computes_them():
    """Per element, through the cost model's annotation of traced nodes: sin/cos a range reduction + polynomial
    (20 FLOPs), exp the exp/log class (4), x ** 3 two multiplies, x ** 0.5 a square root (4), x ** 1.5
    exp(n log x) (9); the exponent table itself for more exponents."""
    from trex.cost_model.annotate import cluster_of
    from trex.passes.compute_once import flops_per_element

    def program(x):
        return x.cos(), x.sin(), x.exp(), x**3, x**0.5, x**1.5

    gm = make_fx(program, tracing_mode="fake")(torch.rand(8, 8))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [flops_per_element(n, cluster_of("cpu")) for n in nodes] == [20, 20, 4, 2, 4, 9]
    assert [power_flops_per_element(n) for n in (0, 1, 2, 3, 4, 7, -1, 0.5)] == [0, 0, 1, 2, 2, 4, 1, 4]
    assert power_flops_per_element(None) == 9  # a tensor exponent


def test_tiny_qwen3_moe_trains_like_eager_with_its_rotary_tables_computed_once(step_matches_eager):
    """One fp32 training step of tiny Qwen3-MoE through trex + Inductor on bench/compile_and_step.py's batch (4 x 32
    tokens): the cos and sin tables are marked in the forward and in the backward (which recomputes them), and
    loss and gradients equal eager's."""
    from trex.models import build_model, tiny_config

    config = tiny_config("qwen3-moe")
    model = build_model(config, dtype=torch.float32, seed=1)
    reference = copy.deepcopy(model)
    from trex.backends.inductor import InductorBackend

    compiled = trex.compile(model, backend=[InductorBackend(), "eager"])
    step_matches_eager(compiled, model, reference, config, torch.float32, tokens=(4, 32))  # the bench's batch
    (graph,) = compiled.trex.graphs
    marks = [
        d.data["graph"]
        for r in graph.report.records
        if r.name == "compute_once"
        for d in r.decisions
        if d.action == "compute_once"
    ]
    assert sorted(marks) == ["backward", "backward", "forward", "forward"], marks
