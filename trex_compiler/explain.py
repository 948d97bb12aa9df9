"""`trex.explain(model, example_inputs, target=...)`: where a training step's time goes, per op.

Captures the model the way `trex.compile` does (Dynamo + AOTAutograd joint forward+backward graph,
then the default pass pipeline, so MoE layers appear as dispatch / grouped_mm / combine), prices
every node for the target with `annotate`, and prints one table: per op, how many nodes, FLOPs,
bytes, estimated time and its share, and the FLOP formula with the shapes it was evaluated at.
Ops without a formula are listed by name under the table.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn

from trex.cost_model.annotate import AnnotationReport, annotate, cluster_of
from trex.cost_model.cluster import Cluster
from trex.cost_model.devices import DeviceProfile


@dataclass
class Explanation:
    """The annotated graphs and their combined report; `print()` shows the table again."""

    target: str
    graphs: list[fx.GraphModule] = field(default_factory=list)
    report: AnnotationReport | None = None

    def rows(self) -> list[dict[str, Any]]:
        """One row per op, slowest first."""
        assert self.report is not None
        formulas: dict[str, str] = {}
        for graph in self.graphs:
            for node in graph.graph.nodes:
                cost = node.meta.get("cost")
                if cost is not None and cost.priced and cost.op not in formulas and cost.formula is not None:
                    formulas[cost.op] = cost.describe()
        total = self.report.total_time_s or 1.0
        rows = []
        for op, seconds in self.report.time_by_op.most_common():
            rows.append(
                {
                    "op": op,
                    "count": self.report.count_by_op[op],
                    "flops": self.report.flops_by_op[op],
                    "time_s": seconds,
                    "share": seconds / total,
                    "formula": formulas.get(op, ""),
                }
            )
        return rows

    def print(self, file: Any = None, limit: int = 40) -> None:
        from rich.console import Console
        from rich.table import Table

        assert self.report is not None
        console = Console(file=file or sys.stdout, width=160)
        table = Table(title=f"estimated cost per op on {self.target} (joint forward + backward)")
        for column, justify in (
            ("op", "left"),
            ("nodes", "right"),
            ("GFLOP", "right"),
            ("time (ms)", "right"),
            ("share", "right"),
            ("formula (first node)", "left"),
        ):
            table.add_column(column, justify=justify)
        rows = self.rows()
        for row in rows[:limit]:
            table.add_row(
                row["op"],
                str(row["count"]),
                f"{row['flops'] / 1e9:.3f}",
                f"{row['time_s'] * 1e3:.3f}",
                f"{row['share']:.1%}",
                row["formula"][:70],
            )
        if len(rows) > limit:
            rest = rows[limit:]
            table.add_row(
                f"... {len(rest)} more ops",
                str(sum(r["count"] for r in rest)),
                f"{sum(r['flops'] for r in rest) / 1e9:.3f}",
                f"{sum(r['time_s'] for r in rest) * 1e3:.3f}",
                f"{sum(r['share'] for r in rest):.1%}",
                "",
            )
        console.print(table)
        report = self.report
        console.print(
            f"total: {report.nodes} nodes, {report.priced} priced, {report.total_flops / 1e9:.3f} GFLOP, "
            f"{report.total_bytes / 1e6:.1f} MB moved, {report.total_time_s * 1e3:.3f} ms estimated"
        )
        kinds = ", ".join(f"{kind} {seconds * 1e3:.3f} ms" for kind, seconds in report.time_by_kind.most_common())
        console.print(f"by kind: {kinds}")
        if report.unpriced:
            listed = ", ".join(f"{op} (x{n})" for op, n in report.unpriced.most_common())
            console.print(f"[red]unpriced ops (no formula, not counted):[/red] {listed}")


def capture_joint_graphs(
    model: nn.Module, example_inputs: Sequence[Any] | Mapping[str, Any], *, passes: Any = None
) -> list[fx.GraphModule]:
    """Joint forward+backward graphs of `model` on `example_inputs`, through `trex.compile`."""
    import trex

    compiled = trex.compile(model, passes=passes, fallback="eager")
    if isinstance(example_inputs, Mapping):
        compiled(**example_inputs)
    else:
        compiled(*example_inputs)
    graphs = [g.joint for g in compiled.trex.graphs if g.joint is not None]
    return graphs


def explain(
    model: nn.Module | fx.GraphModule,
    example_inputs: Sequence[Any] | Mapping[str, Any] = (),
    target: str | DeviceProfile | Cluster = "cpu",
    *,
    groups: Mapping[str, Sequence[int]] | None = None,
    world_size: int | None = None,
    print_table: bool = True,
    passes: Any = None,
) -> Explanation:
    """Capture (unless given a graph), price every op for `target`, print the per-op table and totals."""
    cluster = cluster_of(target)
    graphs = (
        [model] if isinstance(model, fx.GraphModule) else capture_joint_graphs(model, example_inputs, passes=passes)
    )
    explanation = Explanation(target=f"{cluster.name} ({cluster.device.name})", graphs=graphs)
    combined = AnnotationReport(target=explanation.target)
    for graph in graphs:
        combined.merge(annotate(graph, cluster, groups=groups, world_size=world_size))
    explanation.report = combined
    if print_table:
        explanation.print()
    return explanation
