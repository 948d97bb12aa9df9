"""Capture: Dynamo graph -> AOTAutograd joint forward+backward graph -> trex pipeline -> backends.

`TrexCompiler` is a Dynamo backend. For each graph Dynamo hands it, AOTAutograd traces the joint
forward+backward graph (aten ops, FakeTensor `meta["val"]` on every node); trex runs its pass
pipeline on that joint graph (so passes see forward and backward together), partitions it into the
forward and backward that run, and lowers each across the chosen backends. Graphs with no gradient
to compute (inference, `torch.no_grad()`) go through the same pipeline as forward-only graphs.

Every graph is kept, inspectable after the fact, as a `CapturedGraph`: the joint graph after the
passes, the forward/backward graphs, the pipeline report (per-pass time, node delta, decisions),
the lowering (which backend runs which node), and how long each stage took.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

from trex.backends import Backend, Lowering, backend_names_from_env, default_backend_names, get_backend, lower_graph
from trex.backends.eager import EagerBackend
from trex.dump import DumpWriter
from trex.pass_manager import Pass, PassContext, PassManager, PipelineReport, disabled_from_env, fuel_from_env
from trex.targets import Target, get_target


@dataclass
class GraphBreak:
    """Where Dynamo split the program, and why."""

    reason: str
    frames: list[traceback.FrameSummary]

    @property
    def location(self) -> str:
        if not self.frames:
            return "<unknown location>"
        frame = self.frames[-1]
        return f"{frame.filename}:{frame.lineno} in {frame.name}"

    @property
    def source_line(self) -> str:
        return (self.frames[-1].line or "").strip() if self.frames else ""

    def describe(self) -> str:
        reason = " ".join(self.reason.split())
        text = f"{self.location}\n      {self.source_line}\n    reason: {reason[:400]}"
        return text

    @classmethod
    def from_reason(cls, reason: Any) -> GraphBreak:
        return cls(str(getattr(reason, "reason", reason)), list(getattr(reason, "user_stack", []) or []))


@dataclass
class CapturedGraph:
    """One graph Dynamo captured and trex compiled, with everything trex decided about it."""

    graph_id: int
    phase: str  # "joint" or "inference"
    dynamo_graph: fx.GraphModule
    graph_break: GraphBreak | None = None  # why Dynamo ended the previous graph here (fallback runs)
    joint: fx.GraphModule | None = None  # after the pipeline; the forward graph itself for inference
    forward: fx.GraphModule | None = None
    backward: fx.GraphModule | None = None
    report: PipelineReport | None = None
    lowerings: dict[str, Lowering] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # aot_trace, passes, partition, lower_*
    started_at: float = field(default=0.0, repr=False)  # when trex received the Dynamo graph

    def summary(self) -> str:
        parts = [f"graph {self.graph_id} ({self.phase}): dynamo {len(self.dynamo_graph.graph.nodes)} nodes"]
        if self.joint is not None:
            parts.append(f"{'joint' if self.phase == 'joint' else 'forward'} {len(self.joint.graph.nodes)} nodes")
        if self.forward is not None and self.backward is not None:
            parts.append(f"forward {len(self.forward.graph.nodes)} / backward {len(self.backward.graph.nodes)} nodes")
        timing = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in self.seconds.items())
        return "; ".join(parts) + (f" ({timing})" if timing else "")


@dataclass
class CompileOptions:
    target: Target
    backends: list[Backend]  # priority order, eager last
    pipeline: list[Pass]
    disabled: set[str] = field(default_factory=set)
    fuel: int | None = None
    dump_dir: Path | None = None

    @property
    def partitioner(self) -> str:
        """The forward/backward split the leading backend wants ("default" or "min_cut")."""
        return getattr(self.backends[0], "partitioner", "default")

    @classmethod
    def build(cls, *, target: str = "cpu", backend: Any = None, passes: Any = None, dump_dir: str | Path | None = None, environ: dict[str, str] | None = None) -> CompileOptions:
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
        return cls(
            target=get_target(target),
            backends=backends,
            pipeline=resolve_pipeline(passes),
            disabled=disabled_from_env(environ),
            fuel=fuel_from_env(environ),
            dump_dir=Path(dump) if dump else None,
        )


class TrexCompiler:
    """A Dynamo backend (callable on `(gm, example_inputs)`) that compiles each graph with trex."""

    def __init__(self, options: CompileOptions):
        self.options = options
        self.graphs: list[CapturedGraph] = []
        self._dump: DumpWriter | None = None
        self.foreign_dump_files: list[str] = []

    @property
    def dump(self) -> DumpWriter | None:
        if self.options.dump_dir is not None and self._dump is None:
            self._dump = DumpWriter(self.options.dump_dir)
            self.foreign_dump_files = self._dump.foreign_files
        return self._dump

    def pass_manager(self) -> PassManager:
        return PassManager(self.options.pipeline, disabled=self.options.disabled, fuel=self.options.fuel, dump=self.dump, repro_dir=self.options.dump_dir)

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]):
        reason = getattr(gm, "compile_subgraph_reason", None)
        graph = CapturedGraph(
            graph_id=len(self.graphs),
            phase="joint",
            dynamo_graph=gm,
            graph_break=GraphBreak.from_reason(reason) if reason is not None and getattr(reason, "graph_break", False) else None,
        )
        self.graphs.append(graph)
        graph.started_at = time.perf_counter()
        compile_with_aot = aot_autograd(
            fw_compiler=lambda g, inputs: self._lower(graph, "forward", g),
            bw_compiler=lambda g, inputs: self._lower(graph, "backward", g),
            inference_compiler=lambda g, inputs: self._compile_inference(graph, g),
            partition_fn=lambda joint, joint_inputs, **kw: self._partition(graph, joint, joint_inputs, **kw),
        )
        return compile_with_aot(gm, example_inputs)

    def _context(self, graph: CapturedGraph) -> PassContext:
        return PassContext(target=self.options.target.name, phase=graph.phase, graph_id=graph.graph_id)

    def _run_pipeline(self, graph: CapturedGraph, gm: fx.GraphModule) -> None:
        start = time.perf_counter()
        graph.seconds["aot_trace"] = start - graph.started_at
        graph.report = self.pass_manager().run(gm, self._context(graph))
        graph.seconds["passes"] = time.perf_counter() - start
        graph.joint = gm
        if self.dump is not None:
            self.dump.write_text(self.dump.graph_dir(self._context(graph)).relative_to(self.dump.root) / "summary.txt", graph.report.summary() + "\n")

    def _partition(self, graph: CapturedGraph, joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any):
        self._run_pipeline(graph, joint)
        start = time.perf_counter()
        partition = min_cut_rematerialization_partition if self.options.partitioner == "min_cut" else default_partition
        forward, backward = partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        graph.seconds["partition"] = time.perf_counter() - start
        graph.forward, graph.backward = forward, backward
        if self.dump is not None:
            ctx = self._context(graph)
            for name, module in (("forward", forward), ("backward", backward)):
                self.dump.write_module(module, ctx, name, [f"trex dump: graph {graph.graph_id}, the {name} graph that runs (partitioned from the joint graph after the pipeline)"])
        return forward, backward

    def _compile_inference(self, graph: CapturedGraph, gm: fx.GraphModule):
        graph.phase = "inference"
        self._run_pipeline(graph, gm)
        graph.forward = gm
        return self._lower(graph, "inference", gm)

    def _lower(self, graph: CapturedGraph, which: str, gm: fx.GraphModule):
        start = time.perf_counter()
        lowering = lower_graph(gm, self.options.backends, self.options.target)
        graph.lowerings[which] = lowering
        graph.seconds[f"lower_{which}"] = time.perf_counter() - start
        if self.dump is not None:
            ctx = self._context(graph)
            self.dump.write_text(self.dump.graph_dir(ctx).relative_to(self.dump.root) / f"lowering_{which}.txt", lowering.describe() + "\n")
        return make_boxed_func(lowering.module)


def dynamo_backend(gm: fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None):
    """`torch.compile(model, backend="trex", options={...})`: trex's pipeline on Dynamo's graph.

    `options` takes `trex.compile`'s keywords: target, backend, passes, dump_dir. Unlike
    `trex.compile`, this entry point cannot switch transformers' experts to the fused trex MoE op
    (it only sees the graph), so MoE layers stay as Dynamo captured them.
    """
    compiler = TrexCompiler(CompileOptions.build(**(options or {})))
    return compiler(gm, example_inputs)
