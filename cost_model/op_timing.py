"""Measured vs predicted time of every node of a captured graph, on this machine.

Runs a joint graph once on real tensors made from its FakeTensor metadata (floats drawn small, integer
inputs zero so every index stays in range), keeps every intermediate value, then times each
call_function node on its own (the fastest of several calls, like `trex calibrate`) and sets it next
to the time `annotate` predicts with the calibrated CPU profile. Views and waits are left out: they
are priced at zero by definition and measure only dispatch overhead.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from trex.cost_model.annotate import annotate
from trex.cost_model.cluster import Cluster

SKIPPED_KINDS = ("view", "sync", "unpriced")


@dataclass(frozen=True)
class NodeTiming:
    node: str
    op: str
    kind: str
    predicted_s: float
    measured_s: float


def _materialize(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point:
            return (torch.randn(value.shape, dtype=torch.float32) * 0.02).to(value.dtype)
        return torch.zeros(value.shape, dtype=value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_materialize(v) for v in value)
    return value


def run_and_record(gm: fx.GraphModule) -> dict[fx.Node, Any]:
    """Execute `gm` on synthetic inputs; every node's value."""
    env: dict[fx.Node, Any] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, node: fx.Node) -> Any:
            result = super().run_node(node)
            env[node] = result
            return result

    inputs = [_materialize(node.meta.get("val")) for node in gm.graph.nodes if node.op == "placeholder"]
    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return env


def _fastest(fn: Any, repeats: int) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def time_graph(gm: fx.GraphModule, cluster: Cluster, repeats: int = 5) -> list[NodeTiming]:
    annotate(gm, cluster)
    env = run_and_record(gm)
    timings = []
    with torch.no_grad():
        for node in gm.graph.nodes:
            cost = node.meta.get("cost")
            if node.op != "call_function" or cost is None or not cost.priced or cost.kind in SKIPPED_KINDS:
                continue
            args = fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
            measured = _fastest(lambda: node.target(*args, **kwargs), repeats)
            timings.append(NodeTiming(node.name, cost.op, cost.kind, cost.time_s, measured))
    return timings


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation (Pearson correlation of the ranks)."""
    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx and vy else 0.0


def median_relative_error(timings: list[NodeTiming]) -> float:
    """Median of |predicted - measured| / measured."""
    errors = sorted(abs(t.predicted_s - t.measured_s) / t.measured_s for t in timings if t.measured_s > 0)
    return errors[len(errors) // 2] if errors else math.nan
