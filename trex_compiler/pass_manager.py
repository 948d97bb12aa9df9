"""The pass manager: runs a pipeline of passes over an fx graph and instruments every step.

A pass is a small object with a `name`, a docstring that states the invariant it establishes, and
`run(gm, ctx) -> PassResult`. Passes never print: the manager times each one, counts the node delta,
lints the graph and re-propagates FakeTensor shapes where it changed the graph (so a pass that breaks the graph is
caught at the pass that broke it), records its decisions, and with a dump directory writes the graph
and the decisions after every pass. From outside, passes can be disabled by name
(`TREX_PASSES=-name`) and the total number of rewrites bounded (`TREX_FUEL=N`) to bisect a bad
rewrite. A pass that raises is reported by name, with the passes that ran before it and a
reproducer (the pass's input graph + the pipeline) on disk.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import fx

from trex.changed_shapes import NodeStates, propagate_changed_shapes
from trex.errors import PassError, SettingError, TrexError
from trex.graph_copy import copy_graph_module
from trex.graph_inline import symbolic_layouts

if TYPE_CHECKING:
    from trex.dump import DumpWriter

# Writes a failing pass's input graph and the remaining pipeline somewhere; returns the folder
# (`trex.repro.write_reproducer`, bound to a directory by the compile driver).
Reproducer = Callable[[fx.GraphModule, list["Pass"], "PassContext"], Path]


@dataclass
class Decision:
    """One choice a pass made, with the reason (and the numbers that decided it)."""

    action: str
    subject: str
    reason: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self, pass_name: str) -> dict[str, Any]:
        return {
            "pass": pass_name,
            "action": self.action,
            "subject": self.subject,
            "reason": self.reason,
            **({"data": self.data} if self.data else {}),
        }


@dataclass
class PassResult:
    modified: bool
    decisions: list[Decision] = field(default_factory=list)


@runtime_checkable
class Pass(Protocol):
    """What the pass manager runs. Subclass-free: any object with these members is a pass.

    A pass may also declare `stage = "partitioned"` (see `pass_stage`)."""

    name: ClassVar[str]

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult: ...


JOINT, PARTITIONED = "joint", "partitioned"


def pass_stage(pass_: Pass) -> str:
    """Which graphs a pass runs on: "joint" (the default: the joint forward+backward graph, before the
    partitioner decides what the backward saves) or "partitioned" (the forward and the backward graph
    that run, after that decision: a rewrite that must not change what is saved - e.g. an upcast whose
    fp32 copy the partitioner would save instead of its bf16 source - declares it). An inference graph
    has no partition and runs both stages in pipeline order."""
    return getattr(pass_, "stage", JOINT)


class Fuel:
    """A budget of rewrites shared by the whole pipeline (`TREX_FUEL=N`); None is unlimited.

    Passes call `ctx.fuel.take()` before each individual rewrite and skip the rewrite when it returns
    False, so N=k applies exactly the first k rewrites: bisect k to find the one that breaks a model.
    """

    def __init__(self, budget: int | None):
        self.budget = budget
        self.used = 0

    def take(self) -> bool:
        if self.budget is not None and self.used >= self.budget:
            return False
        self.used += 1
        return True

    @property
    def exhausted(self) -> bool:
        return self.budget is not None and self.used >= self.budget


@dataclass
class PassContext:
    """What a pass may read besides the graph. Costs and shardings live on `node.meta`, not here."""

    target: str = "cpu"
    phase: str = "joint"  # "joint" (forward+backward), "inference" or "forward"
    graph_id: int = 0
    fuel: Fuel = field(default_factory=lambda: Fuel(None))
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PassRecord:
    """What the manager observed about one pass."""

    name: str
    ran: bool
    modified: bool = False
    seconds: float = 0.0
    nodes_before: int = 0
    nodes_after: int = 0
    decisions: list[Decision] = field(default_factory=list)
    skipped_reason: str = ""

    @property
    def node_delta(self) -> int:
        return self.nodes_after - self.nodes_before


@dataclass
class PipelineReport:
    graph_id: int
    phase: str
    records: list[PassRecord] = field(default_factory=list)

    @property
    def decisions(self) -> list[tuple[str, Decision]]:
        return [(r.name, d) for r in self.records for d in r.decisions]

    def summary(self) -> str:
        lines = [f"graph {self.graph_id} ({self.phase})"]
        for r in self.records:
            if r.ran:
                lines.append(
                    f"  {r.name:<28} {r.seconds * 1e3:8.1f} ms  nodes {r.nodes_before} -> {r.nodes_after} ({r.node_delta:+d})  decisions {len(r.decisions)}"
                )
            else:
                lines.append(f"  {r.name:<28} skipped: {r.skipped_reason}")
        return "\n".join(lines)


def pipeline_string(passes: Iterable[Pass | str]) -> str:
    return ",".join(p if isinstance(p, str) else p.name for p in passes)


def disabled_from_env(environ: dict[str, str] | None = None) -> set[str]:
    """`TREX_PASSES=-a,-b` disables passes a and b (a leading '-' per name, comma separated)."""
    spec = (environ if environ is not None else os.environ).get("TREX_PASSES", "").strip()
    if not spec:
        return set()
    disabled = set()
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.startswith("-"):
            raise TrexError(
                f"TREX_PASSES={spec!r}: each entry disables a pass and starts with '-' (e.g. TREX_PASSES=-dead_code_elimination); got {item!r}"
            )
        disabled.add(item[1:])
    return disabled


def fuel_from_env(environ: dict[str, str] | None = None) -> int | None:
    value = (environ if environ is not None else os.environ).get("TREX_FUEL", "").strip()
    if not value:
        return None
    try:
        fuel = int(value)
    except ValueError:
        raise TrexError(
            f"TREX_FUEL={value!r} is not an integer; set it to the number of rewrites to allow (e.g. TREX_FUEL=10)"
        ) from None
    if fuel < 0:
        raise TrexError(f"TREX_FUEL={fuel} is negative; use 0 (no rewrites) or more")
    return fuel


def count_nodes(gm: fx.GraphModule) -> int:
    return len(gm.graph.nodes)


def fake_inputs(gm: fx.GraphModule) -> list[Any]:
    """The FakeTensor (or SymInt) value of every placeholder, in order."""
    values = []
    for node in gm.graph.find_nodes(op="placeholder"):
        if "val" not in node.meta:
            raise TrexError(
                f"placeholder {node.name} has no meta['val']; trex graphs carry FakeTensor metadata on every node (capture with trex.compile)"
            )
        values.append(node.meta["val"])
    return values


def _fake_mode_of(values: Sequence[Any]):
    from torch._guards import detect_fake_mode

    return detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])


def propagate_shapes(gm: fx.GraphModule) -> None:
    """Recompute node.meta['val'] for every node with FakeTensorProp (the pass invariant check)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    inputs = fake_inputs(gm)
    mode = _fake_mode_of(inputs)
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)
        FakeTensorProp(gm, mode).propagate(*inputs)
        return
    with mode:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*inputs)


def _output_signature(gm: fx.GraphModule) -> list[tuple[tuple[int, ...], torch.dtype] | None]:
    (output,) = gm.graph.find_nodes(op="output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    signature = []
    for arg in results:
        value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
        signature.append((tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else None)
    return signature


def check_graph(
    gm: fx.GraphModule, pass_name: str, outputs_before: list | None = None, states: NodeStates | None = None
) -> None:
    """Lint, recompile, re-propagate shapes, and check the outputs kept their shapes and dtypes.

    With `states` (each node as it was before the pass), only the nodes the pass changed and those their
    change reaches are re-propagated (`trex.changed_shapes`); without, or when the graph was captured with
    dynamic (symbolic) sizes, every node: a symbolic size's guards and hints are the shape environment's, and
    the partial re-propagation is checked against a full one on static graphs only."""
    gm.graph.lint()
    gm.recompile()
    inputs = fake_inputs(gm) if states is not None else []
    mode = _fake_mode_of(inputs) if states is not None and not symbolic_layouts(inputs) else None
    if mode is not None:
        propagate_changed_shapes(gm, states, mode)
    else:
        propagate_shapes(gm)
    if outputs_before is not None:
        outputs_after = _output_signature(gm)
        if outputs_after != outputs_before:
            changed = [(i, b, a) for i, (b, a) in enumerate(zip(outputs_before, outputs_after)) if a != b]
            raise TrexError(
                f"pass {pass_name} changed the graph's outputs (index, before, after): {changed[:5]}"
                if changed
                else f"pass {pass_name} changed the number of graph outputs from {len(outputs_before)} to {len(outputs_after)}"
            )


class PassManager:
    """Runs `pipeline` in order on one graph. See the module docstring for what it checks."""

    def __init__(
        self,
        pipeline: Sequence[Pass],
        *,
        disabled: Iterable[str] = (),
        fuel: int | None = None,
        dump: DumpWriter | None = None,
        reproducer: Reproducer | None = None,
    ):
        for p in pipeline:
            if not isinstance(p, Pass):
                raise TrexError(f"{p!r} is not a pass: a pass has a `name` and `run(gm, ctx) -> PassResult`")
        self.pipeline = list(pipeline)
        self.disabled = set(disabled)
        unknown = self.disabled - {p.name for p in self.pipeline}
        if unknown:
            from trex.errors import UnknownNameError

            raise UnknownNameError(
                "pass", sorted(unknown)[0], [p.name for p in self.pipeline], hint="set by TREX_PASSES or passes="
            )
        self.fuel = fuel
        self.dump = dump
        self.reproducer = reproducer

    @property
    def pipeline_string(self) -> str:
        return pipeline_string(self.pipeline)

    def run(
        self,
        gm: fx.GraphModule,
        ctx: PassContext | None = None,
        *,
        stages: Iterable[str] = (JOINT, PARTITIONED),
        fuel: Fuel | None = None,
    ) -> PipelineReport:
        """Run the pipeline's passes of `stages` on `gm`; a pass of another stage gets a record that says
        where it runs. `fuel` carries a budget over from an earlier run (the joint graph's, for the
        partitioned graphs)."""
        ctx = ctx or PassContext()
        ctx.fuel = fuel if fuel is not None else Fuel(self.fuel)
        stages = set(stages)
        report = PipelineReport(ctx.graph_id, ctx.phase)
        if self.dump is not None:
            self.dump.write_graph(gm, ctx, index=0, title="capture", header={"pipeline": self.pipeline_string})
        # One copy of the input, not one per pass: a failing pass's input is rebuilt from it by replaying
        # the passes that ran before it (see _input_of), which only a failure pays for.
        initial = copy_graph_module(gm)
        for index, pass_ in enumerate(self.pipeline, start=1):
            record = PassRecord(pass_.name, ran=False, nodes_before=count_nodes(gm), nodes_after=count_nodes(gm))
            report.records.append(record)
            if pass_stage(pass_) not in stages:
                record.skipped_reason = f"runs on the {pass_stage(pass_)} graphs"
                continue
            if pass_.name in self.disabled:
                record.skipped_reason = "disabled by TREX_PASSES / passes="
                continue
            if ctx.fuel.exhausted:
                record.skipped_reason = f"out of fuel (TREX_FUEL={self.fuel})"
                continue
            outputs_before = _output_signature(gm)
            start = time.perf_counter()
            states = NodeStates(gm)
            try:
                result = pass_.run(gm, ctx)
                if not isinstance(result, PassResult):
                    raise TrexError(f"pass {pass_.name} returned {type(result).__name__}, not a PassResult")
                if result.modified or count_nodes(gm) != record.nodes_before:
                    check_graph(gm, pass_.name, outputs_before, states)
                else:  # unchanged: the structural lint is enough
                    gm.graph.lint()
            except SettingError:
                raise
            except Exception as error:  # noqa: BLE001 - any failure inside a pass is reported the same way
                snapshot, replay_from = self._input_of(pass_, report, initial, ctx)
                raise self._pass_failed(pass_, report, snapshot, ctx, error, replay_from) from error
            record.ran = True
            record.seconds = time.perf_counter() - start
            record.modified = result.modified
            record.decisions = list(result.decisions)
            record.nodes_after = count_nodes(gm)
            if self.dump is not None:
                self.dump.write_graph(
                    gm, ctx, index=index, title=pass_.name, record=record, header={"pipeline": self.pipeline_string}
                )
        return report

    def _input_of(
        self, failed: Pass, report: PipelineReport, initial: fx.GraphModule, ctx: PassContext
    ) -> tuple[fx.GraphModule, Pass]:
        """The graph `failed` received, and `failed`: the passes that ran before it, replayed on a copy of the
        pipeline's input with the same fuel budget (passes are deterministic). Should a replay raise, the
        pipeline's input and its first pass that ran (the reproducer then replays from there)."""
        ran = {r.name for r in report.records if r.ran}
        before = [p for p in self.pipeline[: self.pipeline.index(failed)] if p.name in ran]
        graph = copy_graph_module(initial)
        replay = PassContext(target=ctx.target, phase=ctx.phase, graph_id=ctx.graph_id, options=dict(ctx.options))
        replay.fuel = Fuel(self.fuel)
        try:
            for pass_ in before:
                pass_.run(graph, replay)
                check_graph(graph, pass_.name)
        except Exception:  # noqa: BLE001 - the reproducer then starts from the pipeline's input
            return copy_graph_module(initial), (before or [failed])[0]
        return graph, failed

    def _pass_failed(
        self,
        pass_: Pass,
        report: PipelineReport,
        graph_before: fx.GraphModule,
        ctx: PassContext,
        error: Exception,
        replay_from: Pass | None = None,
    ) -> PassError:
        before = [r.name for r in report.records if r.ran]
        remaining = self.pipeline[self.pipeline.index(replay_from or pass_) :]
        detail = "".join(traceback.format_exception_only(type(error), error)).strip()
        frames = traceback.extract_tb(error.__traceback__)
        if frames:
            detail += f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})"
        return PassError(
            f"pass {pass_.name!r} failed on graph {ctx.graph_id} ({ctx.phase}): {detail}\n"
            f"  passes that ran before it: {', '.join(before) or '(none)'}\n"
            + self._reproducer_line(graph_before, remaining, ctx)
            + f"  to run without it: TREX_PASSES=-{pass_.name}"
        )

    def _reproducer_line(self, graph_before: fx.GraphModule, remaining: list[Pass], ctx: PassContext) -> str:
        if self.reproducer is None:
            return ""
        try:
            where = self.reproducer(graph_before, remaining, ctx)
        except Exception as error:  # noqa: BLE001 - a reproducer that cannot be written must not hide the pass's own error
            return f"  reproducer: could not be written ({type(error).__name__}: {error})\n"
        return f"  reproducer: python {where / 'repro.py'}  (input graph {where / 'graph.py'}, pipeline {pipeline_string(remaining)})\n"
