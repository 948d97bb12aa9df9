"""CPU GEMM precision: bf16/fp16 GEMMs run as fp32 GEMMs on CPUs without native low-precision GEMM units.

A bf16 GEMM accumulates in fp32 wherever it runs; what differs is how its operands reach the
multiply units. CPUs with AVX512-BF16 or AMX multiply bf16 directly; without them (AVX2 machines,
this project's development CPU among them) oneDNN/MKL take a slow path: at the tiny models' shapes a
bf16 `mm` costs 6-23x the fp32 `mm` on upcast operands, CPU flash attention 1.7x (bench/cpu_ops/
gemm_precision_and_op_overhead.py; bench/RESULTS.md section 11, third session). Converting the operands to fp32 (exact), multiplying in fp32
and rounding the product once to bf16 computes the same value as the bf16 GEMM up to the order of
the fp32 accumulation, at a fraction of the time, and a code generator fuses the conversions into the
kernels that produce the operands.

The pass rewrites `aten.mm`, `addmm`, `bmm`, `baddbmm` and CPU flash attention (forward and backward)
whose floating operands are all bf16 (fp16) into convert -> the same op in fp32 -> convert back, when the
target is a CPU and the CPU compiling (the one the program will run on) lacks native bf16 (fp16) GEMM
support. The grouped GEMMs (`trex.grouped_mm`, `trex.grouped_mm_weight_grad`, and `aten._grouped_mm`,
decompose_moe's bf16 expert GEMMs) become `trex.extern_aten_grouped_mm` on their own low-precision
operands, which upcasts, multiplies and rounds one group (expert) at a time: the same values, without
fp32 copies of whole weights, token blocks and results alive around the GEMM (with whole-operand upcasts
trex's bf16 peak step memory exceeded Inductor's, bench/RESULTS.md section 11, eighth and ninth sessions).

On a CPU that does multiply bf16 (fp16) natively, the grouped GEMMs are still rewritten, and only they:
a grouped GEMM runs one GEMM per expert, with that expert's row count - runtime data that changes with
the routing, step by step. oneDNN, behind PyTorch's native bf16 CPU GEMMs, generates (JIT-compiles) a
kernel for each new problem shape and keeps it in its primitive cache (oneDNN developer guide,
"Primitive Cache": creating a primitive is expensive, the cache amortises it over calls with the same
parameters); the fp32 GEMM on upcasts runs BLAS kernels that are not generated per shape. On this
project's AMX CPU a bf16 `mm` with a row count not seen before cost ~0.7 ms of CPU time against ~0.03 ms
for the fp32 GEMM on upcasts (bench/cpu_ops/bf16_gemm_new_shapes.py; bench/RESULTS.md section 11,
eighth session). GEMMs with static shapes (`mm`, attention) meet each shape once and keep the native path, except where an
fp32 form with bounded fp32 copies exists and is measured faster: CPU flash attention's backward is timed on
this CPU at its own shape both ways (`passes.cpu_gemm_precision.timing`, conversions included) and, when the fp32 form
is `UPCAST_MARGIN` times faster, runs in fp32 a few heads at a time (`trex.extern_flash_attention_backward_on_
upcasts`). Native units are not always the faster path at small shapes: on the AMD EPYC with AVX512-BF16 (no
AMX) of bench/RESULTS.md 11 (fourteenth session) that backward took ~850 us per call in bf16 against ~70 us in
fp32 (377 us in chunks) at tiny Qwen3-MoE's shapes. Static `mm`s are not timed: their fp32 form upcasts whole
operands, which raised tiny DeepSeek-V3 bf16's peak above Inductor's for a ~1% step gain there.
`CpuGemmPrecision(measure=False)` times nothing (the same graph on every compile); the decisions in the dump
carry both timings.

It runs on the partitioned forward and backward graphs (`stage = "partitioned"`), not on the joint
graph: there, the fp32 upcast of an activation is its only user, so the min-cut partitioner saved the
fp32 copy for the backward instead of the bf16 value (twice the bytes: bf16 steps held 1.3-1.7x
Inductor's peak memory, bench/RESULTS.md section 11). After the partition the backward receives the
bf16 values torch.compile's partition saves and upcasts them itself (a code generator fuses each
convert into the GEMM operand's producer or reads it once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import fx

from trex.graph_inline import inline_traced, on_meta_device, replace_node
from trex.pass_manager import Decision, PassContext, PassResult
from trex.passes.canonicalize.moe import PROVENANCE_KEYS
from trex.passes.cpu_gemm_precision.timing import native_and_upcast_seconds

aten = torch.ops.aten
GEMMS = frozenset(
    {
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten.baddbmm.default,
        torch.ops.trex.grouped_mm.default,
        torch.ops.trex.grouped_mm_weight_grad.default,
        aten._grouped_mm.default,  # decompose_moe's bf16 expert GEMMs (-> trex.extern_aten_grouped_mm)
        # CPU attention is GEMMs too (1.7x slower in bf16 here, fwd+bwd, 4 x 4 heads x 32 x 32)
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    }
)
LOW_PRECISION = (torch.bfloat16, torch.float16)
# On a CPU with native units a GEMM is upcast only when its fp32 form timed this much faster here: two timings
# of the same call move by ~10-20% on a shared 2-core machine, and a decision that flips with the noise would
# change the compiled graph (and its roundings) from one compile to the next
UPCAST_MARGIN = 1.25
# The GEMMs timed on a CPU with native units: those whose fp32 form keeps its fp32 copies bounded (CPU flash
# attention's backward, a few heads at a time). A static GEMM's fp32 form upcasts whole operands: on tiny
# DeepSeek-V3 bf16 the mm upcasts that timed faster (16.8 -> 13.2 us) raised the step's peak from 1.92 to 1.99
# MiB, above Inductor's 1.96, for ~0.1 ms of a 9 ms step (bench/RESULTS.md 11, fourteenth session)
BOUNDED_UPCASTS = frozenset({aten._scaled_dot_product_flash_attention_for_cpu_backward.default})
# GEMMs whose per-group row counts are runtime data (the routing): upcast even where the CPU has native
# bf16 (fp16) units, whose kernels are generated per shape (see the module docstring)
GROUPED_GEMMS = frozenset(
    {
        torch.ops.trex.grouped_mm.default,
        torch.ops.trex.grouped_mm_weight_grad.default,
        aten._grouped_mm.default,
    }
)


def native_cpu_gemm_dtypes() -> set[torch.dtype]:
    """The low-precision dtypes this CPU multiplies natively (AVX512-BF16 / AMX-BF16, AMX-FP16)."""
    native = set()
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        native.add(torch.bfloat16)
    if torch.cpu._is_amx_fp16_supported():
        native.add(torch.float16)
    return native


def _operand_dtype(node: fx.Node) -> torch.dtype | None:
    """The one low-precision dtype of the node's floating operands (fp32 ones, e.g. attention's
    logsumexp, aside), or None when there is none or they mix two."""
    dtypes = set()
    for arg in node.all_input_nodes:
        value = arg.meta.get("val")
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float32:
            dtypes.add(value.dtype)
    return dtypes.pop() if len(dtypes) == 1 else None


ATTENTION_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _upcast_form(node: fx.Node) -> tuple[Any, list[fx.Node]]:
    """The fp32 form of `node` as a function of its tensor inputs, and those inputs: converts -> the op in fp32
    -> converts back, except CPU flash attention's backward, which becomes
    `trex.extern_flash_attention_backward_on_upcasts` on its own low-precision operands (fp32 copies of a few
    (batch element, head) pairs at a time: whole-operand copies and fp32 gradients alive together raised the bf16 step's
    peak memory above Inductor's, bench/RESULTS.md 11, fourteenth session)."""
    if node.target is not ATTENTION_BACKWARD:
        return _upcast_call(node, {})
    from trex.ops import cpu_attention  # noqa: F401 - registers trex.extern_flash_attention_backward_on_upcasts

    inputs = list(node.all_input_nodes)
    position = {arg: i for i, arg in enumerate(inputs)}
    extern = torch.ops.trex.extern_flash_attention_backward_on_upcasts.default

    def on_upcasts(*tensors):
        args = fx.node.map_arg(node.args, lambda a: tensors[position[a]])
        kwargs = fx.node.map_arg(node.kwargs, lambda a: tensors[position[a]])
        return tuple(extern(*args, **kwargs))

    return on_upcasts, inputs


def _upcast_call(node: fx.Node, upcasts: dict[fx.Node, fx.Node]) -> tuple[Any, list[fx.Node]]:
    """A function of the node's tensor inputs computing the node's op in fp32, rounded to its dtype, and those
    inputs: a low-precision input's fp32 copy from `upcasts` where it has one (the function's own upcast of
    an fp32 tensor is then no op)."""
    inputs = list(node.all_input_nodes)
    position = {arg: i for i, arg in enumerate(inputs)}
    inputs = [upcasts.get(arg, arg) for arg in inputs]
    target, value = node.target, node.meta["val"]

    def fp32(*tensors):
        def operand(arg):
            tensor = tensors[position[arg]]
            return tensor.float() if tensor.is_floating_point() else tensor

        args = fx.node.map_arg(node.args, operand)
        kwargs = fx.node.map_arg(node.kwargs, operand)
        result = target(*args, **kwargs)
        if isinstance(value, torch.Tensor):
            return result.to(value.dtype)
        return tuple(r.to(v.dtype) if isinstance(v, torch.Tensor) else r for r, v in zip(result, value))

    return fp32, inputs


class CpuGemmPrecision:
    """Invariant established: on a CPU target without native bf16 (fp16) GEMMs, no GEMM of the list above
    has bf16 (fp16) operands, and on one with them no grouped GEMM has: each non-grouped one became converts
    to fp32, the GEMM in fp32 and a convert of its result back (same shape and dtype); each grouped one became
    `trex.extern_aten_grouped_mm` on the same operands, which multiplies in fp32 one group at a time (exact
    upcasts, one rounding per element); CPU flash attention's backward - and, on a CPU with native units, one
    that timed `UPCAST_MARGIN` times faster in fp32 - became `trex.extern_flash_attention_backward_on_upcasts`
    on its own operands (fp32 a few heads at a time, one rounding per element). Each rewrite consumes one unit
    of fuel.
    """

    name: ClassVar[str] = "cpu_gemm_precision"
    # after the partition: the partitioner decides what the backward saves on the bf16 graph (as for
    # torch.compile), so it saves bf16 activations, not the fp32 upcasts that feed only the GEMMs
    stage: ClassVar[str] = "partitioned"

    def __init__(
        self,
        native: set[torch.dtype] | None = None,
        measure: bool = True,
        timer: Callable[[fx.Node, Callable[..., Any], list[fx.Node]], tuple[float, float] | None] | None = None,
    ):
        self.native = native  # None: ask this CPU (tests pass a set to stand in for another CPU)
        # On a CPU with native units, time each non-grouped GEMM both ways here and upcast it when fp32 is
        # faster by UPCAST_MARGIN (cpu_gemm_precision.timing); False keeps every native GEMM native (deterministic graphs)
        self.measure = measure
        self.timer = timer or native_and_upcast_seconds  # tests stand in a CPU's timings

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        from trex.targets import get_target

        if get_target(ctx.target).device_type != "cpu":
            return _decline(f"target {ctx.target!r} is not a CPU")
        if not ctx.options.get("gemms_on_this_cpu", True):
            return _decline("the leading backend lowers GEMMs to another device's kernels, not this CPU's")
        if on_meta_device(gm):
            return _decline("a graph of meta tensors is captured to be priced, never run on this CPU")
        native = native_cpu_gemm_dtypes() if self.native is None else self.native
        slow = [d for d in LOW_PRECISION if d not in native]
        decisions = []
        inherit = (*PROVENANCE_KEYS, "trex_moe")
        decompositions = ctx.options.get("decompositions")
        upcasts: dict[fx.Node, fx.Node] = {}  # each low-precision operand is upcast once, before its first GEMM
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in GEMMS:
                continue
            dtype = _operand_dtype(node)
            if dtype not in LOW_PRECISION:
                continue
            measured = None
            if dtype not in slow and node.target not in GROUPED_GEMMS:
                if not self.measure or node.target not in BOUNDED_UPCASTS:
                    continue
                fn, inputs = _upcast_form(node)
                measured = self.timer(node, fn, inputs)
                if measured is None or measured[1] * UPCAST_MARGIN >= measured[0]:
                    if measured is not None:
                        decisions.append(
                            Decision(
                                "keep",
                                node.name,
                                _timed_reason(dtype, measured, upcast=False),
                                _timing_data(node, measured),
                            )
                        )
                    continue
            if node.target in GROUPED_GEMMS and not _plain_grouped_mm(node):
                continue
            if not ctx.fuel.take():
                break
            if node.target in GROUPED_GEMMS:
                replace_node(gm, node, _grouped_on_group_upcasts(gm, node, inherit, decompositions))
                decisions.append(
                    Decision("upcast", node.name, _upcast_reason(dtype, dtype in slow, True), {"op": str(node.target)})
                )
                continue
            if node.target is ATTENTION_BACKWARD:  # per batch element, on its own operands (see _upcast_form)
                fn, inputs = _upcast_form(node)
                replace_node(gm, node, inline_traced(gm, node, fn, inputs, inherit, decompositions))
                reason = (
                    _upcast_reason(dtype, dtype in slow, False)
                    if measured is None
                    else _timed_reason(dtype, measured, upcast=True)
                )
                data = {"op": str(node.target)} if measured is None else _timing_data(node, measured)
                decisions.append(Decision("upcast", node.name, reason, data))
                continue
            for arg in node.all_input_nodes:
                value = arg.meta.get("val")
                if arg not in upcasts and isinstance(value, torch.Tensor) and value.dtype == dtype:
                    (upcasts[arg],) = inline_traced(gm, node, _to_fp32, [arg], inherit, decompositions)
            fn, inputs = _upcast_call(node, upcasts)
            replace_node(
                gm,
                node,
                inline_traced(gm, node, fn, inputs, inherit, decompositions),
            )
            # whole-operand upcasts: only where the CPU has no native units (timed GEMMs are the bounded ones above)
            decisions.append(
                Decision("upcast", node.name, _upcast_reason(dtype, True, False), {"op": str(node.target)})
            )
        if not slow and not any(d.action == "upcast" for d in decisions):
            reason = (
                "this CPU multiplies bf16 and fp16 natively and no low-precision GEMM of the graph is faster in fp32"
            )
            return PassResult(modified=False, decisions=[Decision("decline", "graph", reason), *decisions])
        modified = any(d.action == "upcast" for d in decisions)
        if modified:
            gm.graph.lint()
            gm.recompile()
        return PassResult(modified=modified, decisions=decisions)


def _timing_data(node: fx.Node, measured: tuple[float, float]) -> dict[str, Any]:
    return {"op": str(node.target), "native_us": measured[0] * 1e6, "fp32_upcast_us": measured[1] * 1e6}


def _timed_reason(dtype: torch.dtype, measured: tuple[float, float], upcast: bool) -> str:
    name = str(dtype).removeprefix("torch.")
    native, fp32 = (seconds * 1e6 for seconds in measured)
    verdict = (
        "fp32 on exact upcasts, a few heads at a time, each gradient rounded once"
        if upcast
        else f"not {UPCAST_MARGIN}x faster in fp32, kept native"
    )
    return (
        f"{name} GEMM timed on this CPU at this shape: native {native:.1f} us, fp32 on exact upcasts {fp32:.1f} us "
        f"(conversions included): {verdict}"
    )


def _upcast_reason(dtype: torch.dtype, slow: bool, grouped: bool) -> str:
    name = str(dtype).removeprefix("torch.")
    how = (
        "fp32 GEMM on exact upcasts of one expert's operands at a time, each product rounded once"
        if grouped
        else "fp32 GEMM on exact upcasts, rounded once"
    )
    if slow:
        return f"{name} {'grouped ' if grouped else ''}GEMM on a CPU without native {name} units: {how}"
    return (
        f"{name} grouped GEMM: its per-expert row counts change with the routing and the native {name} kernel "
        f"is generated per shape; {how}"
    )


def _grouped_on_group_upcasts(gm: fx.GraphModule, node: fx.Node, inherit, decompositions) -> fx.Node:
    """The grouped GEMM `node` as `trex.extern_aten_grouped_mm` on its own low-precision operands, which upcasts
    and multiplies one group (expert) at a time (`ops.moe_decompositions.grouped_mm_on_group_upcasts`): no fp32
    copy of a whole operand or result is alive around the GEMM (whole-operand upcasts held trex's bf16 peak step
    memory above Inductor's, bench/RESULTS.md section 11). `trex.grouped_mm_weight_grad(a, b, offsets)` is the
    reduction-grouped form on `a`'s transpose."""
    from trex.ops import moe_decompositions  # noqa: F401 - registers trex.extern_aten_grouped_mm

    extern = torch.ops.trex.extern_aten_grouped_mm.default
    if node.target is torch.ops.trex.grouped_mm_weight_grad.default:

        def grouped(a, b, offsets):
            return extern(a.t(), b, offsets)
    else:

        def grouped(mat_a, mat_b, offs):
            return extern(mat_a, mat_b, offs)

    return inline_traced(gm, node, grouped, list(node.args), inherit, decompositions)


def _to_fp32(tensor: torch.Tensor) -> tuple[torch.Tensor]:
    return (tensor.float(),)


def _plain_grouped_mm(node: fx.Node) -> bool:
    """A grouped GEMM with only its three operands, (mat_a, mat_b, offs) in a form `trex.extern_aten_grouped_mm`
    takes (the trex ops' forms are always such: [S, K] x [E, K, N], and [S, K]^T x [S, N])."""
    from trex.ops.moe_decompositions import aten_grouped_mm_form_supported

    if len(node.args) != 3 or any(v is not None for v in node.kwargs.values()):
        return False
    if not all(isinstance(a, fx.Node) for a in node.args):
        return False
    if node.target is not aten._grouped_mm.default:
        return True
    mat_a, mat_b = (a.meta["val"] for a in node.args[:2])
    return aten_grouped_mm_form_supported(mat_a, mat_b)


def _decline(reason: str) -> PassResult:
    return PassResult(modified=False, decisions=[Decision("decline", "graph", reason)])
