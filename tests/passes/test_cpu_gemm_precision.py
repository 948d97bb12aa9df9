"""cpu_gemm_precision: on a CPU without native bf16 GEMMs, bf16 GEMMs run in fp32 and train like eager bf16."""

from __future__ import annotations

import copy

import pytest
import torch

import trex
from trex.pass_manager import PassContext
from trex.passes import CpuGemmPrecision

ops = torch.ops.trex
GEMMS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, ops.grouped_mm.default}


class _Block(torch.nn.Module):
    def __init__(self, hidden=16, experts=4):
        super().__init__()
        self.proj = torch.nn.Linear(hidden, hidden)  # addmm (with its bias) and mm in the backward
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * hidden, hidden) * hidden**-0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, hidden) * hidden**-0.5)

    def forward(self, x):
        x = self.proj(x)
        weights, index = torch.topk(torch.softmax(self.router(x), -1), 2, dim=-1)
        return (
            torch.ops.trex.moe_experts(x, index, weights, self.gate_up, self.down, "silu", 0.0, False)[0] ** 2
        ).sum()


class _Attention(torch.nn.Module):
    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).float().pow(2).sum()


def _trains_like_eager_bf16(model: torch.nn.Module, x: torch.Tensor, passes):
    """One forward+backward of bf16 `model` through trex (eager backend, `passes`) against eager: loss and every
    gradient close (bf16 tolerances), gradients in bf16. Returns trex's graph record."""
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend="eager", passes=passes)
    loss = compiled(x)
    loss.backward()
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=2e-2, atol=2e-2)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.grad.dtype == torch.bfloat16
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=2e-2)
    return compiled.trex.graphs[0]


def _bf16_attention_trains_like_eager(passes, hidden=32, seq=32):
    """`_trains_like_eager_bf16` on a bf16 `_Attention` (seeded)."""
    torch.manual_seed(0)
    return _trains_like_eager_bf16(
        _Attention(hidden).bfloat16(), torch.randn(2, seq, hidden, dtype=torch.bfloat16), passes
    )


def _gemm_dtypes(gm):
    return {
        (n.target, arg.meta["val"].dtype)
        for n in gm.graph.nodes
        if n.target in GEMMS
        for arg in n.all_input_nodes
        if arg.meta["val"].is_floating_point()
    }


def test_bf16_gemms_become_fp32_gemms_and_train_like_eager_bf16():
    torch.manual_seed(0)
    model, x = _Block().bfloat16(), torch.randn(12, 16, dtype=torch.bfloat16, requires_grad=True)
    reference, x_ref = copy.deepcopy(model), x.detach().clone().requires_grad_(True)
    passes = ["canonicalize_moe", CpuGemmPrecision(native=set())]  # stands in for a CPU without bf16 units
    compiled = trex.compile(model, backend="eager", passes=passes)
    loss = compiled(x)
    loss.backward()
    expected = reference(x_ref)
    expected.backward()
    tolerance = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(loss, expected, **tolerance)
    torch.testing.assert_close(x.grad, x_ref.grad, **tolerance)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.grad.dtype == torch.bfloat16
        torch.testing.assert_close(p.grad, q.grad, **tolerance)
    graph = compiled.trex.graphs[0]
    for module in (graph.forward, graph.backward):
        dtypes = _gemm_dtypes(module)
        assert dtypes and {d for _, d in dtypes} == {torch.float32}, dtypes
    record = next(r for r in graph.report.records if r.name == "cpu_gemm_precision")
    assert record.decisions and all(d.action == "upcast" and "bfloat16" in d.reason for d in record.decisions)


def test_declines_where_the_cpu_multiplies_bf16_natively_or_the_target_is_not_a_cpu():
    graph = torch.fx.Graph()
    graph.output(graph.placeholder("x"))
    gm = torch.fx.GraphModule({}, graph)
    native = CpuGemmPrecision(native={torch.bfloat16, torch.float16}).run(gm, PassContext())
    assert not native.modified and "natively" in native.decisions[0].reason
    gpu = CpuGemmPrecision(native=set()).run(gm, PassContext(target="h100"))
    assert not gpu.modified and "not a CPU" in gpu.decisions[0].reason


def test_fp32_gemms_are_left_alone():
    model, x = _Block(), torch.randn(12, 16)
    compiled = trex.compile(model, backend="eager", passes=["canonicalize_moe", CpuGemmPrecision(native=set())])
    compiled(x).backward()
    record = next(r for r in compiled.trex.graphs[0].report.records if r.name == "cpu_gemm_precision")
    assert not record.modified


def test_cpu_attention_runs_in_fp32_and_matches_eager_bf16():
    graph = _bf16_attention_trains_like_eager([CpuGemmPrecision(native=set())], hidden=16, seq=6)
    record = next(r for r in graph.report.records if r.name == "cpu_gemm_precision")
    ops_done = {d.data["op"] for d in record.decisions}
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in ops_done
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward.default" in ops_done


def _bf16_block_trains_like_eager(passes):
    """`_trains_like_eager_bf16` on a bf16 `_Block` (seeded)."""
    torch.manual_seed(0)
    return _trains_like_eager_bf16(_Block().bfloat16(), torch.randn(12, 16, dtype=torch.bfloat16), passes)


@pytest.mark.parametrize("decomposed", [False, True], ids=["trex_grouped_mm", "aten_grouped_mm"])
def test_on_a_cpu_with_native_bf16_only_the_grouped_gemms_are_upcast(decomposed):
    """Native bf16 units: the grouped GEMMs (per-expert row counts set by the routing, a native kernel generated
    per shape) run in fp32 one expert at a time (`trex.extern_aten_grouped_mm` on the bf16 operands); the
    static-shape GEMMs (`mm`, `addmm`) keep their bf16 operands."""
    from trex.passes import DecomposeMoe

    native = CpuGemmPrecision(native={torch.bfloat16, torch.float16}, measure=False)  # no timing: static stay
    graph = _bf16_block_trains_like_eager(
        ["canonicalize_moe"] + ([DecomposeMoe(force=True)] if decomposed else []) + [native]
    )
    grouped = {ops.grouped_mm.default, ops.grouped_mm_weight_grad.default, torch.ops.aten._grouped_mm.default}
    static = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
    operand_dtypes = {"grouped": set(), "static": set()}
    for module in (graph.forward, graph.backward):
        for node in module.graph.nodes:
            kind = "grouped" if node.target in grouped else "static" if node.target in static else None
            if kind is not None:
                operand_dtypes[kind] |= {
                    a.meta["val"].dtype for a in node.all_input_nodes if a.meta["val"].is_floating_point()
                }
        extern = [n for n in module.graph.nodes if n.target is torch.ops.trex.extern_aten_grouped_mm.default]
        assert (
            extern
            and all(  # on the bf16 operands themselves: no whole fp32 copy is made for it
                a.meta["val"].dtype == torch.bfloat16 for n in extern for a in n.args[:2]
            )
        )
    assert operand_dtypes["static"] == {torch.bfloat16}
    assert operand_dtypes["grouped"] == set()  # every grouped GEMM became the extern one
    record = next(r for r in graph.report.records if r.name == "cpu_gemm_precision")
    assert record.decisions and all(d.action == "upcast" and "grouped GEMM" in d.reason for d in record.decisions)


def _saved_bytes(graph) -> int:
    """Bytes of the values the forward graph hands the backward (its outputs after the user-visible ones)."""
    (output,) = graph.forward.graph.find_nodes(op="output")
    values = [a.meta["val"] for a in output.args[0] if isinstance(a, torch.fx.Node)]
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def test_the_backward_saves_bf16_activations_not_their_fp32_upcasts():
    """The pass runs after the partition: what the backward saves is what it saves without the pass (bf16),
    and the decomposed expert GEMMs (`aten._grouped_mm`, bf16) run as `trex.extern_aten_grouped_mm` (fp32 GEMMs
    on one expert's upcasts at a time)."""
    from trex.passes import DecomposeMoe

    saved = {}
    for upcast in (False, True):
        passes = ["canonicalize_moe", DecomposeMoe(force=True)] + ([CpuGemmPrecision(native=set())] if upcast else [])
        graph = _bf16_block_trains_like_eager(passes)
        saved[upcast] = _saved_bytes(graph)
        targets = {n.target for g in (graph.forward, graph.backward) for n in g.graph.nodes}
        assert (torch.ops.aten._grouped_mm.default in targets) != upcast
        assert (torch.ops.trex.extern_aten_grouped_mm.default in targets) == upcast
        for module in (graph.forward, graph.backward):  # each bf16 operand is upcast once per graph
            upcast_sources = [
                n.args[0]
                for n in module.graph.nodes
                if n.target in (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)
                and n.meta["val"].dtype == torch.float32
                and n.args[0].meta["val"].dtype == torch.bfloat16
            ]
            assert len(upcast_sources) == len(set(upcast_sources)), upcast_sources
    assert saved[True] == saved[False]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_grouped_gemm_on_group_upcasts_equals_the_whole_operand_upcast(dtype):
    """`trex.extern_aten_grouped_mm` on low-precision operands: each element is the fp32 grouped GEMM on exact
    upcasts, rounded once (bit-equal to upcasting whole operands), in both forms; an empty group and the rows
    past the last offset are zero."""
    from trex.ops import moe_decompositions  # noqa: F401 - registers the op

    extern = torch.ops.trex.extern_aten_grouped_mm
    generator = torch.Generator().manual_seed(0)
    offs = torch.tensor([5, 5, 17, 30], dtype=torch.int32)  # group 1 empty, rows 30..31 in no group
    a = torch.randn(32, 16, generator=generator).to(dtype)
    b = torch.randn(4, 16, 8, generator=generator).to(dtype)
    out = extern(a, b, offs)
    assert out.dtype == dtype and out.shape == (32, 8)
    whole = torch._grouped_mm(a.float(), b.float(), offs=offs).to(dtype)
    assert torch.equal(out[:30], whole[:30])
    assert not out[30:].any()
    grad_out = torch.randn(32, 8, generator=generator).to(dtype)
    weight_grad = extern(a.t(), grad_out, offs)  # the reduction dimension grouped: [K, M] x [M, N] -> [G, K, N]
    assert weight_grad.dtype == dtype and weight_grad.shape == (4, 16, 8)
    expected = torch._grouped_mm(a.float().t(), grad_out.float(), offs=offs).to(dtype)
    assert torch.equal(weight_grad, expected)
    assert not weight_grad[1].any()


def _static_gemm_operand_dtypes(graph) -> set[torch.dtype]:
    static = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
    return {
        a.meta["val"].dtype
        for module in (graph.forward, graph.backward)
        for n in module.graph.nodes
        if n.target in static
        for a in n.all_input_nodes
        if a.meta["val"].is_floating_point()
    }


@pytest.mark.parametrize(
    ("native_us", "fp32_us", "upcast"),
    [(100.0, 20.0, True), (20.0, 100.0, False), (22.0, 20.0, False)],
    ids=["fp32_much_faster", "native_faster", "fp32_faster_within_the_margin"],
)
def test_on_a_cpu_with_native_bf16_the_attention_backward_is_upcast_when_it_timed_faster_in_fp32(
    native_us, fp32_us, upcast
):
    """The choice follows the two timings of the attention backward (here a stand-in CPU's): upcast only when the
    fp32 form is UPCAST_MARGIN times faster, to `trex.extern_flash_attention_backward_on_upcasts` on the bf16
    operands; the static mm's are never timed (their fp32 form copies whole operands); the dump carries both
    timings; the step trains like eager bf16 either way."""
    timed = []

    def timer(node, upcast_form, inputs):
        timed.append(node.target)
        return native_us * 1e-6, fp32_us * 1e-6

    graph = _bf16_attention_trains_like_eager([CpuGemmPrecision(native={torch.bfloat16, torch.float16}, timer=timer)])
    assert timed == [torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default]
    targets = {n.target for n in graph.backward.graph.nodes}
    # upcast: the bf16 operands go to the chunked op (fp32 copies of a few heads at a time), the aten op is gone
    assert (torch.ops.trex.extern_flash_attention_backward_on_upcasts.default in targets) == upcast
    assert (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default in targets) != upcast
    assert _static_gemm_operand_dtypes(graph) == {torch.bfloat16}
    record = next(r for r in graph.report.records if r.name == "cpu_gemm_precision")
    (decision,) = [d for d in record.decisions if d.action in ("upcast", "keep")]
    assert decision.action == ("upcast" if upcast else "keep")
    assert decision.data["native_us"] == pytest.approx(native_us) and "timed on this CPU" in decision.reason


def test_the_timing_runs_real_kernels_even_under_a_fake_tensor_mode():
    """`native_and_upcast_seconds` times the node's op and its fp32 form on real example operands with the node's
    layout (an expanded operand included), also when the pass runs under FakeTensorMode, and times each distinct
    node once."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from trex.passes.cpu_gemm_precision import _upcast_call
    from trex.passes.cpu_gemm_precision import timing as cpu_gemm_timing

    a = torch.randn(64, 32, dtype=torch.bfloat16)
    b = torch.randn(32, 1, dtype=torch.bfloat16).expand(32, 48)  # stride 0: storage of 32 values
    gm = make_fx(torch.mm, tracing_mode="fake")(a, b)  # each node's meta["val"]: a fake tensor with its layout
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert [tuple(arg.meta["val"].stride()) for arg in node.all_input_nodes] == [a.stride(), b.stride()]
    example = cpu_gemm_timing.example_tensor(b)
    assert example.shape == b.shape and example.stride() == b.stride() and example.dtype == torch.bfloat16
    cpu_gemm_timing._CACHE.clear()
    fn, inputs = _upcast_call(node, {})
    with FakeTensorMode():
        native, fp32 = cpu_gemm_timing.native_and_upcast_seconds(node, fn, inputs)
    assert 0 < native < 1 and 0 < fp32 < 1
    assert cpu_gemm_timing.native_and_upcast_seconds(node, fn, inputs) == (native, fp32)  # cached
