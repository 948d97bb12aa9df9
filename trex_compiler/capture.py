"""Capture records: what Dynamo and AOTAutograd produced for each graph, and where Dynamo broke.

The compile driver (`trex.driver`) fills a `CapturedGraph` per Dynamo graph: the joint
forward+backward aten graph after the passes (FakeTensor `meta["val"]` on every node), the
forward/backward graphs that run, the pipeline report (per-pass time, node delta, decisions), the
lowering (which backend runs which node), and how long each stage took. `GraphBreak` says where
Dynamo split the program and why.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import fx

if TYPE_CHECKING:
    from trex.backends import Lowering
    from trex.pass_manager import PipelineReport


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
    # the Dynamo graph's inputs in order: parameters as themselves, other inputs None (Backend.prepare)
    graph_inputs: list | None = field(default=None, repr=False)

    def summary(self) -> str:
        parts = [f"graph {self.graph_id} ({self.phase}): dynamo {len(self.dynamo_graph.graph.nodes)} nodes"]
        if self.joint is not None:
            parts.append(f"{'joint' if self.phase == 'joint' else 'forward'} {len(self.joint.graph.nodes)} nodes")
        if self.forward is not None and self.backward is not None:
            parts.append(f"forward {len(self.forward.graph.nodes)} / backward {len(self.backward.graph.nodes)} nodes")
        timing = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in self.seconds.items())
        return "; ".join(parts) + (f" ({timing})" if timing else "")
