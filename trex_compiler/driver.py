"""The compile driver: Dynamo graph -> AOTAutograd joint graph -> trex pass pipeline -> partition -> backends.

`TrexCompiler` is a Dynamo backend. For each graph Dynamo hands it, AOTAutograd traces the joint
forward+backward graph (aten ops, FakeTensor `meta["val"]` on every node); trex runs its pass
pipeline on that joint graph (so passes see forward and backward together), partitions it into the
forward and backward that run, and lowers each across the chosen backends. Graphs with no gradient
to compute (inference, `torch.no_grad()`) go through the same pipeline as forward-only graphs.
Each graph's record is a `trex.capture.CapturedGraph`.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
from torch.fx._lazy_graph_module import _LazyGraphModule

from trex.backends import Backend, backend_names_from_env, default_backend_names, get_backend, lower_graph
from trex.backends.eager import EagerBackend
from trex.capture import CapturedGraph, GraphBreak
from trex.collector import freeze_survivors, skip_existing_objects
from trex.dump import DumpWriter
from trex.pass_manager import (
    JOINT,
    PARTITIONED,
    Pass,
    PassContext,
    PassManager,
    PassRecord,
    disabled_from_env,
    fuel_from_env,
    pass_stage,
)
from trex.repro import write_reproducer
from trex.targets import Target, get_target


@dataclass
class CompileOptions:
    target: Target
    backends: list[Backend]  # priority order, eager last
    pipeline: list[Pass]
    disabled: set[str] = field(default_factory=set)
    fuel: int | None = None
    dump_dir: Path | None = None
    progress: Callable[[str], None] | None = None  # one line per compile stage (the CLI prints them)

    @property
    def partitioner(self) -> str:
        """The forward/backward split the leading backend wants ("default" or "min_cut")."""
        return getattr(self.backends[0], "partitioner", "default")

    @classmethod
    def build(
        cls,
        *,
        target: str = "cpu",
        backend: Any = None,
        passes: Any = None,
        dump_dir: str | Path | None = None,
        environ: dict[str, str] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> CompileOptions:
        import os

        from trex.passes import resolve_pipeline

        environ = dict(os.environ if environ is None else environ)
        if backend is None:  # not given: TREX_BACKENDS, else Inductor where it works, eager for the rest
            backend = backend_names_from_env(environ) or default_backend_names()
        specs = list(backend) if isinstance(backend, (list, tuple)) else [backend]
        backends = [get_backend(s) for s in specs]
        if not any(b.name == EagerBackend.name for b in backends):
            backends.append(EagerBackend())
        dump = dump_dir if dump_dir is not None else environ.get("TREX_DUMP") or None
        if dump:
            from trex.outputs import output_dir

            output_dir(dump, "dump_dir" if dump_dir is not None else "TREX_DUMP")
        return cls(
            target=get_target(target),
            backends=backends,
            pipeline=resolve_pipeline(passes),
            disabled=disabled_from_env(environ),
            fuel=fuel_from_env(environ),
            dump_dir=Path(dump) if dump else None,
            progress=progress,
        )


class TrexCompiler:
    """A Dynamo backend (callable on `(gm, example_inputs)`) that compiles each graph with trex."""

    def __init__(self, options: CompileOptions):
        self.options = options
        self.graphs: list[CapturedGraph] = []
        self._dump: DumpWriter | None = None
        self.foreign_dump_files: list[str] = []
        self._fuel = None  # the rewrite budget the joint passes left (see _run_partitioned_passes)

    @property
    def dump(self) -> DumpWriter | None:
        if self.options.dump_dir is not None and self._dump is None:
            self._dump = DumpWriter(self.options.dump_dir)
            self.foreign_dump_files = self._dump.foreign_files
        return self._dump

    def pass_manager(self) -> PassManager:
        reproducer = functools.partial(write_reproducer, directory=self.options.dump_dir)
        return PassManager(
            self.options.pipeline,
            disabled=self.options.disabled,
            fuel=self.options.fuel,
            dump=self.dump,
            reproducer=reproducer,
        )

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]):
        reason = getattr(gm, "compile_subgraph_reason", None)
        graph = CapturedGraph(
            graph_id=len(self.graphs),
            phase="joint",
            dynamo_graph=gm,
            graph_break=GraphBreak.from_reason(reason)
            if reason is not None and getattr(reason, "graph_break", False)
            else None,
        )
        self.graphs.append(graph)
        graph.started_at = time.perf_counter()
        graph.graph_inputs = [x if isinstance(x, torch.nn.Parameter) else None for x in example_inputs]
        for backend in self.options.backends:  # rewrites AOTAutograd must trace through (an op's own autograd)
            backend.prepare(gm, "captured", graph.graph_inputs)
        extra = {} if self._decompositions is None else {"decompositions": self._decompositions}
        compile_with_aot = aot_autograd(
            fw_compiler=lambda g, inputs: self._lower(graph, "forward", g),
            bw_compiler=lambda g, inputs: self._lower(graph, "backward", g),
            inference_compiler=lambda g, inputs: self._compile_inference(graph, g),
            partition_fn=lambda joint, joint_inputs, **kw: self._partition(graph, joint, joint_inputs, **kw),
            **extra,
        )
        with self._backward_lowering(), skip_existing_objects():
            return compile_with_aot(gm, example_inputs)

    def _backward_lowering(self):
        """Lower the backward right after the forward, not at the first backward call (AOTAutograd's
        default), when a backend keeps building the forward's kernels after lowering it
        (`builds_kernels_in_background`: `InductorBackend(background_builds=True)` on CPU, opt-in): the
        backward's lowering then runs while the forward's kernels build (backends/inductor/kernel_builds.py).
        A compiled training graph's first call then pays for the backward even if it never runs backward."""
        import torch._functorch.config as functorch_config

        target = self.options.target
        if not any(getattr(b, "builds_kernels_in_background", lambda t: False)(target) for b in self.options.backends):
            return contextlib.nullcontext()
        return functorch_config.patch(force_non_lazy_backward_lowering=True)

    @functools.cached_property
    def _decompositions(self) -> dict | None:
        """The leading backend's decompositions for the AOTAutograd trace (`trace_decompositions`), if any:
        the joint graph is then traced once in the form the backend compiles (torch.compile traces
        Inductor's graphs so), where it would otherwise trace each region again."""
        leading = self.options.backends[0]
        ask = getattr(leading, "trace_decompositions", None)
        for pass_ in self.options.pipeline:  # a pattern pass that will match undecomposed forms needs them kept
            wants = getattr(pass_, "wants_undecomposed_graph", None)
            if pass_.name not in self.options.disabled and wants is not None and wants(self.options.target.name):
                return None
        return ask(self.options.target) if ask is not None else None

    def _mark_decomposed(self, *graphs: fx.GraphModule) -> None:
        if self._decompositions is not None:
            from trex.backends.inductor.backend import DECOMPOSED

            for module in graphs:
                module.meta[DECOMPOSED] = self.options.backends[0].name

    def _say(self, graph: CapturedGraph, what: str) -> None:
        if self.options.progress is not None:
            self.options.progress(f"graph {graph.graph_id}: {what} ({time.perf_counter() - graph.started_at:.1f} s)")

    def _context(self, graph: CapturedGraph) -> PassContext:
        # passes.decompose_moe: the leading backend fuses around the MoE primitives' aten form;
        # passes.cpu_gemm_precision: the leading backend runs GEMMs on this CPU's kernels (not a device's)
        leading = self.options.backends[0]
        options = {
            "decompose_moe": bool(getattr(leading, "decomposes_moe_primitives", False)),
            "gemms_on_this_cpu": bool(getattr(leading, "runs_gemms_on_this_cpu", True)),
            # passes.compute_once: the leading backend recomputes a pointwise value inside each kernel reading it
            "inlines_pointwise_into_consumers": bool(getattr(leading, "inlines_pointwise_into_consumers", False)),
            # graph_inline.inline_traced: a rewrite traces its new nodes with the table the graph was traced with
            "decompositions": self._decompositions,
        }
        return PassContext(target=self.options.target.name, phase=graph.phase, graph_id=graph.graph_id, options=options)

    def _run_pipeline(self, graph: CapturedGraph, gm: fx.GraphModule) -> None:
        freeze_survivors()  # the traced graph and its FakeTensors live to the end of the compile
        start = time.perf_counter()
        graph.seconds["aot_trace"] = start - graph.started_at
        self._say(
            graph,
            f"AOTAutograd traced the {'joint forward+backward' if graph.phase == 'joint' else 'forward'} graph, "
            f"{len(gm.graph.nodes)} nodes; running passes",
        )
        stages = (JOINT,) if graph.phase == "joint" else (JOINT, PARTITIONED)  # inference: no partition
        context = self._context(graph)
        graph.report = self.pass_manager().run(gm, context, stages=stages)
        self._fuel = context.fuel  # what the joint passes left, for the partitioned graphs
        graph.seconds["passes"] = time.perf_counter() - start
        graph.joint = gm
        self._say(graph, f"passes done ({', '.join(r.name for r in graph.report.records if r.ran) or 'none ran'})")
        if self.dump is not None:
            self.dump.write_text(
                self.dump.graph_dir(self._context(graph)).relative_to(self.dump.root) / "summary.txt",
                graph.report.summary() + "\n",
            )

    def _partition(
        self, graph: CapturedGraph, joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any
    ):
        self._run_pipeline(graph, joint)
        _save_trex_collectives(joint)
        start = time.perf_counter()
        partition = min_cut_rematerialization_partition if self.options.partitioner == "min_cut" else default_partition
        forward, backward = partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        # code generated when first needed: the partitioned passes recompile after each rewrite, and the
        # Inductor backend compiles from the graph, never from its Python code (the partitioner hands the
        # backward over as a plain GraphModule, whose every recompile regenerates its code)
        forward, backward = (_LazyGraphModule.from_graphmodule(module) for module in (forward, backward))
        _drop_unused_trex_collectives(backward)
        graph.seconds["partition"] = time.perf_counter() - start
        self._run_partitioned_passes(graph, forward, backward)
        self._mark_decomposed(forward, backward)
        graph.forward, graph.backward = forward, backward
        if self.dump is not None:
            ctx = self._context(graph)
            for name, module in (("forward", forward), ("backward", backward)):
                self.dump.write_module(
                    module,
                    ctx,
                    name,
                    [
                        f"trex dump: graph {graph.graph_id}, the {name} graph that runs (partitioned from the joint graph after the pipeline)"
                    ],
                )
        return forward, backward

    def _run_partitioned_passes(self, graph: CapturedGraph, forward: fx.GraphModule, backward: fx.GraphModule) -> None:
        """The pipeline's `partitioned` passes on the forward and the backward graph (in place); each such
        pass's record in `graph.report` becomes one record for both graphs (decisions tagged by graph)."""
        if not any(pass_stage(p) == PARTITIONED for p in self.options.pipeline):
            return
        start = time.perf_counter()
        manager = self.pass_manager()
        reports = {}
        for which, module in (("forward", forward), ("backward", backward)):
            context = self._context(graph)
            context.phase = which
            reports[which] = manager.run(module, context, stages=(PARTITIONED,), fuel=self._fuel)
        assert graph.report is not None
        for index, record in enumerate(graph.report.records):
            if pass_stage(manager.pipeline[index]) != PARTITIONED:
                continue
            parts = [(which, report.records[index]) for which, report in reports.items()]
            merged = PassRecord(
                record.name, ran=any(r.ran for _, r in parts), skipped_reason=parts[0][1].skipped_reason
            )
            for which, part in parts:
                merged.modified |= part.modified
                merged.seconds += part.seconds
                merged.nodes_before += part.nodes_before
                merged.nodes_after += part.nodes_after
                for decision in part.decisions:
                    decision.data = {**decision.data, "graph": which}
                    merged.decisions.append(decision)
            graph.report.records[index] = merged
        graph.seconds["partitioned_passes"] = time.perf_counter() - start

    def _compile_inference(self, graph: CapturedGraph, gm: fx.GraphModule):
        graph.phase = "inference"
        self._run_pipeline(graph, gm)
        self._mark_decomposed(gm)
        graph.forward = gm
        return self._lower(graph, "inference", gm)

    def _lower(self, graph: CapturedGraph, which: str, gm: fx.GraphModule):
        start = time.perf_counter()
        inputs = graph.graph_inputs
        freeze_survivors()  # the partitioned graphs
        with skip_existing_objects():  # the backward is lowered at its first call, outside `__call__`
            lowering = lower_graph(gm, self.options.backends, self.options.target, phase=which, graph_inputs=inputs)
        graph.lowerings[which] = lowering
        graph.seconds[f"lower_{which}"] = time.perf_counter() - start
        self._say(graph, f"{which} graph lowered")
        if self.dump is not None:
            ctx = self._context(graph)
            self.dump.write_text(
                self.dump.graph_dir(ctx).relative_to(self.dump.root) / f"lowering_{which}.txt",
                lowering.describe() + "\n",
            )
        if lowering.boxed is not None:  # one region: AOTAutograd's input list goes to it (inputs freed early)
            lowering.boxed._boxed_call = True  # type: ignore[attr-defined]
            return lowering.boxed
        return make_boxed_func(lowering.module)


_TREX_COLLECTIVES = ("ep_exchange", "ep_counts")  # trex's own collective ops (runtime/expert_parallel.py)


def _is_trex_collective(node: fx.Node) -> bool:
    target = node.target
    return (
        node.op == "call_function"
        and getattr(target, "namespace", None) == "trex"
        and target.__name__.split(".")[0] in _TREX_COLLECTIVES
    )


def _save_trex_collectives(joint: fx.GraphModule) -> None:
    """trex's collective ops are never recomputed in the backward: the partitioner treats them as it treats
    `_c10d_functional` ops (a recomputed exchange would talk again)."""
    from torch.utils.checkpoint import CheckpointPolicy

    for node in joint.graph.nodes:
        if _is_trex_collective(node):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def _drop_unused_trex_collectives(backward: fx.GraphModule) -> None:
    """The partitioner copies a forward exchange into the backward when its inputs are there, even when
    nothing uses it (the node carries a data-dependent size); such a copy would talk over the group again
    for nothing, so it goes."""
    dropped = False
    for node in reversed(list(backward.graph.nodes)):
        if _is_trex_collective(node) and not node.users:
            backward.graph.erase_node(node)
            dropped = True
    if dropped:
        backward.recompile()


def dynamo_backend(gm: fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None):
    """`torch.compile(model, backend="trex", options={...})`: trex's pipeline on Dynamo's graph.

    `options` takes `trex.compile`'s keywords: target, backend, passes, dump_dir. Unlike
    `trex.compile`, this entry point cannot switch transformers' experts to the fused trex MoE op
    (it only sees the graph), so MoE layers stay as Dynamo captured them.
    """
    compiler = TrexCompiler(CompileOptions.build(**(options or {})))
    return compiler(gm, example_inputs)
