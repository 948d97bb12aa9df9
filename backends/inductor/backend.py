"""The Inductor backend: each region trex hands it is decomposed with Inductor's own decomposition
table and compiled by `torch._inductor.compile_fx.compile_fx_inner`, exactly as `torch.compile`
compiles the forward and backward graphs AOTAutograd gives it.

Why a region and not the whole model: trex has already captured, transformed and partitioned the
program; Inductor receives the regions (in the default lowering, the whole forward and the whole
backward graph, trex's MoE ops included as extern calls) and generates fused C++ (CPU) or Triton
(GPU) kernels for them. What it cannot take (a node on a device it has no code generator for, a
value it cannot represent) stays with the next backend in the user's order, and eager last.

Every region's compile time is recorded in `compile_seconds` (region -> seconds), which the
lowering copies into its report.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import fx

from trex.backends.backend import WHOLE_GRAPH, Backend
from trex.backends.inductor.kernel_builds import KernelBuilds, can_defer
from trex.backends.inductor.kernel_bundles import KernelBundler, can_bundle
from trex.backends.inductor.regions import compile_regions, plan_regions
from trex.errors import BackendError

# GraphModule.meta key: the backend whose decompositions the graph was traced with (see trace_decompositions)
DECOMPOSED = "trex_decomposed_for"

# Devices Inductor generates code for.
_DEVICES = frozenset({"cpu", "cuda", "xpu"})


@functools.cache
def inductor_unavailable_reason() -> str | None:
    """None when Inductor can compile here; otherwise why not (shown when the backend is skipped)."""
    try:
        import torch._inductor.compile_fx  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure means "not here"
        return f"torch._inductor does not import: {error}"
    if not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
        return "no C++ compiler (g++, c++ or clang++) on PATH: Inductor's CPU code generator needs one"
    return None


def _tensor_values(value: Any) -> list[torch.Tensor] | None:
    """The tensors of a node's value, or None when it holds anything but tensors (and ints/None)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    tensors = []
    for item in items:
        if isinstance(item, torch.Tensor):
            tensors.append(item)
        elif item is not None and not isinstance(item, (int, float, bool, torch.SymInt)):
            return None
    return tensors


class InductorBackend(Backend):
    name: ClassVar[str] = "inductor"
    description: ClassVar[str] = "torch._inductor code generation (C++/OpenMP on CPU, Triton on GPU) for whole regions"
    partitioner: ClassVar[str] = "min_cut"  # its fused kernels recompute pointwise chains for free
    # passes.decompose_moe: Inductor fuses the gathers and sums of the MoE primitives' aten form into its
    # kernels, where the primitives themselves would be opaque extern calls with Python bodies
    decomposes_moe_primitives: ClassVar[bool] = True
    # passes.compute_once: Inductor inlines a pointwise value into every kernel that reads it (recomputing it
    # per element read); `trex.compute_once` realizes one (backends/inductor/compute_once_lowering.py)
    inlines_pointwise_into_consumers: ClassVar[bool] = True

    def __init__(
        self,
        regional: bool = False,
        runtime_checks: bool = False,
        background_builds: bool = False,
        kernel_bundles: bool = True,
        cpu_grouped_gemm: str = "timed",
    ) -> None:
        self.compile_seconds: dict[str, float] = {}  # region (first node's name) -> seconds
        # regions.py: a graph whose decoder layers repeat is compiled one distinct layer at a time. Opt-in
        # until its first-call saving and its step time are measured on the tiny models (bench/RESULTS.md 11)
        self.regional = regional
        # Keep Inductor's size/stride and alignment asserts in the generated code of a whole-graph region too
        # (see `_runtime_checks`); they are always kept in a region between eager ops
        self.runtime_checks = runtime_checks
        # kernel_builds: a region's C++ kernels finish building at its first call, not inside `lower`, and the
        # backward lowers while the forward's build. Opt-in: on this 2-vCPU machine the overlap made the first
        # call 7-10% slower (bench/kernel_build_overlap.py; bench/RESULTS.md 11, eleventh session)
        self.background_builds = background_builds
        # kernel_bundles: a region's C++ kernels are built as one translation unit per compile thread instead of
        # one compiler process each; the compiler's fixed cost per process was half of a kernel's build here
        # (bench/RESULTS.md 11, fourteenth session). Same code, same flags: values and step time unchanged
        self.kernel_bundles = kernel_bundles
        # cpu_grouped_gemm: how an fp32 CPU grouped GEMM is placed, "timed" (trex's kernel where it measured
        # faster than aten's at the problem's shapes), "trex" (always trex's kernel) or "aten" (never)
        from trex.backends.inductor.cpu_grouped_gemm import POLICIES

        if cpu_grouped_gemm not in POLICIES:
            raise ValueError(
                f"InductorBackend(cpu_grouped_gemm={cpu_grouped_gemm!r}): expected one of {', '.join(POLICIES)} "
                "('timed' measures trex's grouped GEMM kernel against aten's at each problem's shapes)"
            )
        self.cpu_grouped_gemm = cpu_grouped_gemm

    def trace_decompositions(self, target: Any) -> dict | None:
        """The decompositions AOTAutograd should trace the joint graph with when this backend leads:
        Inductor's own table on a CPU target, as `torch.compile` traces it. The graphs trex's passes see
        and partition are then the graphs Inductor compiles, and `lower` need not trace each region a
        second time. None on a GPU target, where passes.triton_patterns matches the undecomposed forms
        (RMSNorm, SwiGLU, RoPE) first and `lower` decomposes each region itself."""
        if getattr(target, "device_type", None) != "cpu":
            return None
        from torch._inductor.decomposition import select_decomp_table

        return select_decomp_table()

    def builds_kernels_in_background(self, target: Any) -> bool:
        """Whether a compiled region's C++ kernels keep building after `lower` returns, until its first call
        (`kernel_builds`): with `background_builds`, on a CPU target. The driver then lowers the backward right
        after the forward, so that it lowers while the forward's kernels build."""
        cpu = getattr(target, "device_type", None) == "cpu"
        return self.background_builds and cpu and inductor_unavailable_reason() is None

    def prepare(self, gm: fx.GraphModule, phase: str, graph_inputs: Sequence[Any] | None) -> None:
        """Scatter-adds into zeros become sums over their index slots (`zero_fills`), so that their buffers are
        not filled in the backward's first kernel and kept alive across the step's peak. On Dynamo's graph of an
        fp32 CPU model with trex's MoE ops, trex's grouped GEMM kernel starts building (`cpu_grouped_gemm`), so that
        it is built by the time the lowering times it."""
        if phase == "captured" and self.cpu_grouped_gemm != "aten" and _fp32_cpu_moe(gm):
            from trex.backends.inductor import cpu_grouped_gemm

            cpu_grouped_gemm.start_build()
        if phase != "captured" and inductor_unavailable_reason() is None:
            from trex.backends.inductor.zero_fills import scatter_adds_as_slot_sums

            scatter_adds_as_slot_sums(gm)

    def supports(self, node: fx.Node) -> bool:
        if node.op != "call_function" or inductor_unavailable_reason() is not None:
            return False
        tensors = _tensor_values(node.meta.get("val"))
        if tensors is None:
            return False
        return all(t.device.type in _DEVICES for t in tensors)

    def lower(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx_inner

        from trex.backends.inductor import cpu_grouped_gemm
        from trex.backends.inductor.compute_once_lowering import register_compute_once_lowering
        from trex.backends.inductor.grouped_mm_lowering import register_grouped_mm_lowerings

        start = time.perf_counter()
        register_grouped_mm_lowerings()
        register_compute_once_lowering()
        region = next((n.name for n in gm.graph.nodes if n.op == "call_function"), "<empty>")
        if gm.meta.get(DECOMPOSED) == self.name and not _undecomposed_nodes(gm):  # compiled as it is
            decomposed, single_output = _tuple_output_graph(gm)
        else:
            decomposed, single_output = _decomposed_tuple_graph(gm, example_inputs)
        plan = plan_regions(decomposed) if self.regional else None
        notes: list[str] = []
        checks = self.runtime_checks or plan is not None or not gm.meta.get(WHOLE_GRAPH, False)
        builds = KernelBuilds()
        defer = self.background_builds and can_defer(example_inputs)
        deferred = builds.deferring() if defer else contextlib.nullcontext()
        bundler = KernelBundler()
        bundling = (
            bundler.collecting() if self.kernel_bundles and can_bundle(example_inputs) else contextlib.nullcontext()
        )
        placement = cpu_grouped_gemm.place(decomposed, self.cpu_grouped_gemm)
        with (
            cpu_grouped_gemm.placing(placement),
            _region_output_strides_unreported(),
            _eager_roundings(decomposed),
            _runtime_checks(checks),
            deferred,
            bundling,
        ):
            if plan is None:
                compiled = compile_fx_inner(decomposed, list(example_inputs))
            else:
                compiled, notes = compile_regions(plan, lambda graph, inputs: compile_fx_inner(graph, list(inputs)))
                notes.insert(0, f"regional compilation: {len(plan.regions)} regions, {plan.distinct} compiled")
        if bundler.bundles or bundler.unbundled:
            notes.append(bundler.summary())
        if placement.choices:
            notes.append(cpu_grouped_gemm.summary(placement.choices))
        self.compile_seconds[region] = time.perf_counter() - start
        builds.on_finish.append(lambda seconds: self._add_seconds(region, seconds))

        def finish_builds() -> None:
            try:
                builds.finish()
            except Exception as error:
                raise BackendError(
                    f"backend 'inductor': building the C++ kernels of region {region} failed: {error} "
                    "(trex.compile(model, backend=['eager']) runs the graph without Inductor's kernels)"
                ) from error

        def run(*args: Any) -> Any:
            if builds.pending:
                finish_builds()
            outputs = compiled(list(args))
            return outputs[0] if single_output else tuple(outputs)

        def run_boxed(args: list[Any]) -> Any:
            if builds.pending:
                finish_builds()
            # Inductor's calling convention: it empties `args` as it starts, so an input (a saved
            # activation, in the backward) is freed when the generated code no longer needs it.
            outputs = compiled(args)
            return outputs[0] if single_output else outputs

        run.trex_region = region  # type: ignore[attr-defined]
        run.trex_notes = notes  # type: ignore[attr-defined]  # copied into the lowering's notes
        run.boxed = run_boxed  # type: ignore[attr-defined]  # see lowering.boxed_single_region
        run.trex_kernel_builds = builds  # type: ignore[attr-defined]  # its waits, done at the first call
        return run

    def _add_seconds(self, region: str, seconds: float) -> None:
        """A deferred kernel wait is part of the region's compile time (`kernel_builds`)."""
        self.compile_seconds[region] = self.compile_seconds.get(region, 0.0) + seconds


def _fp32_cpu_moe(gm: fx.GraphModule) -> bool:
    """Whether Dynamo's graph calls one of trex's MoE ops on fp32 CPU tensors (its grouped GEMMs will be fp32)."""
    if inductor_unavailable_reason() is not None:
        return False
    for node in gm.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "namespace", None) == "trex":
            value = node.meta.get("example_value")
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.device.type == "cpu" for v in values):
                return True
    return False


@contextlib.contextmanager
def _region_output_strides_unreported():
    """Keep a region's output strides out of AOTAutograd's TracingContext.

    Inductor reports the output strides of the graph it compiles to the TracingContext, where
    AOTAutograd reads them as the strides of the whole forward graph's outputs (to restride the
    saved activations the backward receives). A region's outputs are not the forward's outputs, so
    the report would be wrong; Inductor keeps outputs in their traced strides (keep_output_stride).
    """
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    if context is None or context.output_strides is None:
        yield
        return
    saved, context.output_strides = context.output_strides, None
    try:
        yield
    finally:
        context.output_strides = saved


# The environment variables with which a user sets Inductor's asserts himself; trex then keeps his choice.
_ASSERT_SETTINGS = ("TORCHINDUCTOR_SIZE_ASSERTS", "TORCHINDUCTOR_ALIGNMENT_ASSERTS")


def _runtime_checks(keep: bool):
    """Compile without Inductor's size/stride and alignment asserts unless `keep` (or the user set them).

    Why: in its generated Python wrapper Inductor checks, on every call, the size and stride of every graph
    input and the layout of every extern kernel's output (`assert_size_stride`, ~0.4 us each, and
    `assert_alignment`). A whole-graph region's inputs are the graph's inputs, already fixed before it runs
    (`trex.backends.backend.WHOLE_GRAPH`): on tiny Qwen3-MoE that is 49 forward and 160 backward input checks
    of the ~300 per step, and without the asserts the step was 4-9% faster (bench/RESULTS.md 11, tenth
    session). The extern kernels' output layouts are their meta functions' (ATen's; trex's own extern ops are
    tested to return the layout of their fake implementations, tests/backends/test_inductor_backend.py).
    `InductorBackend(runtime_checks=True)` keeps them, and so does setting TORCHINDUCTOR_SIZE_ASSERTS or
    TORCHINDUCTOR_ALIGNMENT_ASSERTS; a region with eager ops around it always keeps them, since its inputs are
    then what eager kernels returned."""
    if keep or any(name in os.environ for name in _ASSERT_SETTINGS):
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config

    return inductor_config.patch(size_asserts=False, alignment_asserts=False)


LOW_PRECISION = (torch.bfloat16, torch.float16)


def low_precision_graph(gm: fx.GraphModule) -> bool:
    """Whether any value of the graph is a bf16 / fp16 tensor."""
    for node in gm.graph.nodes:
        for tensor in _tensor_values(node.meta.get("val")) or []:
            if tensor.dtype in LOW_PRECISION:
                return True
    return False


def _eager_roundings(gm: fx.GraphModule):
    """Inductor compiling a bf16/fp16 graph rounds each value to its dtype where eager does
    (`emulate_precision_casts`), instead of keeping fused intermediates in fp32.

    Why: without it, tiny DeepSeek-V4 in bf16 got the attention sinks' gradient of layer 0 3.2x as far from
    the fp32 run as eager bf16's, while the very graphs Inductor received, run op by op, were 1.35x, and
    Inductor with this setting gives exactly the op-by-op values (bench/RESULTS.md 11, seventh session;
    `bench/numerics/bf16_gradients_vs_fp32.py`). Skipping a rounding in one kernel but not in the kernel
    that recomputes or reads the same value makes forward and backward disagree; the sinks' gradient is a
    cancelling sum over every position and shows it first. fp32 graphs have nothing to round."""
    if not low_precision_graph(gm):
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config

    return inductor_config.patch(emulate_precision_casts=True)


def _undecomposed_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """Nodes Inductor has no lowering for but a decomposition in its table: a rewrite traced them without the
    table (e.g. a user's pass). Inductor would stop on them, so such a region is traced once more."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import lowerings

    table = select_decomp_table()
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in table and n.target not in lowerings]


def _tuple_output_graph(gm: fx.GraphModule) -> tuple[fx.GraphModule, bool]:
    """`gm` (a copy, when its output must change) returning a tuple, as compile_fx_inner takes it."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    if isinstance(output.args[0], (tuple, list)):
        return gm, False
    from trex.graph_copy import copy_graph_module

    gm = copy_graph_module(gm)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    output.args = ((output.args[0],),)
    gm.recompile()
    return gm, True


def _decomposed_tuple_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[fx.GraphModule, bool]:
    """`gm` retraced through Inductor's decompositions, returning a tuple (what compile_fx_inner takes).

    The graph trex hands over is AOTAutograd's core aten graph without Inductor's decompositions
    (they are what lets Inductor fuse, e.g. softmax or the norms into pointwise + reduction loops).
    """
    from torch._guards import detect_fake_mode
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    output = next(n for n in gm.graph.nodes if n.op == "output")
    single_output = not isinstance(output.args[0], (tuple, list))

    def as_tuple(*args: Any) -> tuple:
        result = fx.Interpreter(gm).run(*args)
        return (result,) if single_output else tuple(result)

    fake_mode = detect_fake_mode(list(example_inputs))
    if fake_mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode()
    with fake_mode:
        decomposed = make_fx(as_tuple, decomposition_table=select_decomp_table(), tracing_mode="real")(*example_inputs)
    return decomposed, single_output
