"""How much of a graph's predicted time on the Ascend target went to torch_npu fused operators.

Every node of the graph the backend sees is priced on the target (`trex.cost_model.annotate`, the
cost stored as `node.meta["ascend_cost"]` so the pipeline's own `meta["cost"]` stays as it was).
After lowering, a region node counts as fused when the rewrite removed it (its work is done by the
fused op); region nodes still needed elsewhere stay in the graph and count as not fused. The aten glue
a rewrite adds around a fused call (casts, transposes, masks) is priced too and counts as not fused:
share = fused / (original graph + glue). A fused op is assumed to take the time of the nodes it
replaced (the cost model has no formula of its own for torch_npu's kernels). MoE-layer nodes (tagged
`meta["trex_moe"]` by canonicalization) are also summed on their own; `unfused_by_op` says where the
rest of the time goes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from torch import fx

COST_KEY = "ascend_cost"
# a call a whole-graph rewrite emitted before pricing carries the price of the node it replaced (main_grad.py)
REPLACED_COST = "trex_ascend_replaced_cost"


@dataclass
class AscendGraphReport:
    target: str
    phase: str = ""
    total_s: float = 0.0
    moe_total_s: float = 0.0
    fused_s: float = 0.0
    moe_fused_s: float = 0.0
    unpriced: int = 0
    node_seconds: dict[str, float] = field(default_factory=dict)  # node name -> predicted seconds
    node_ops: dict[str, str] = field(default_factory=dict)  # node name -> its op (e.g. "aten.bmm.default")
    moe_nodes: set[str] = field(default_factory=set)
    fused_nodes: set[str] = field(default_factory=set)
    emitted: Counter = field(default_factory=Counter)
    glue_s: float = 0.0  # the aten glue the rewrites added (casts, views, masks), priced on the target
    moe_glue_s: float = 0.0
    glue_by_op: Counter = field(default_factory=Counter)  # op -> predicted seconds of the glue nodes
    glue_nodes: list[tuple[str, str, float, bool]] = field(default_factory=list)  # (name, op, seconds, in MoE)
    publishes_grads: bool = False  # main_grad accumulations that also set param.grad (see main_grad.py)

    def record_fused(self, nodes: set[str], emitted: list[str]) -> None:
        new = nodes - self.fused_nodes
        self.fused_nodes |= new
        self.fused_s += sum(self.node_seconds.get(n, 0.0) for n in new)
        self.moe_fused_s += sum(self.node_seconds.get(n, 0.0) for n in new if n in self.moe_nodes)
        self.emitted.update(emitted)

    def record_glue(self, nodes: list[fx.Node], *, moe: bool) -> None:
        """Price the aten nodes a rewrite added; they count as time not spent in fused ops."""
        from trex.cost_model.annotate import annotate_node, cluster_of

        cluster = cluster_of(self.target)
        for node in nodes:
            cost = annotate_node(node, cluster)
            seconds = cost.time_s if cost is not None else 0.0
            self.glue_s += seconds
            self.glue_by_op[str(node.target)] += seconds
            self.glue_nodes.append((node.name, str(node.target), seconds, moe))
            if moe:
                self.moe_glue_s += seconds
            if cost is not None and not cost.priced:
                self.unpriced += 1

    @property
    def share(self) -> float:
        """Fused-op time over the lowered graph's time: the original nodes plus the glue added."""
        total = self.total_s + self.glue_s
        return self.fused_s / total if total else 0.0

    @property
    def moe_share(self) -> float:
        total = self.moe_total_s + self.moe_glue_s
        return self.moe_fused_s / total if total else 0.0

    def unfused_by_op(self, *, moe_only: bool = False) -> Counter:
        """Predicted seconds per op of the nodes no fused op took over (where the rest of the time goes)."""
        left: Counter = Counter()
        for name, seconds in self.node_seconds.items():
            if name in self.fused_nodes or (moe_only and name not in self.moe_nodes):
                continue
            left[self.node_ops.get(name, "?")] += seconds
        return left


def price_graph(graph: fx.Graph, target: str, matches) -> AscendGraphReport:
    """Price every call node of `graph` on `target` (kept apart from the pipeline's own costs)."""
    from trex.cost_model.annotate import annotate

    saved = {n: n.meta["cost"] for n in graph.nodes if "cost" in n.meta}
    try:
        annotate(graph, target)
        report = AscendGraphReport(target=target)
        for node in graph.nodes:
            cost = node.meta.get(REPLACED_COST) or node.meta.get("cost")
            if node.op != "call_function" or cost is None:
                continue
            node.meta[COST_KEY] = cost
            if not cost.priced:
                report.unpriced += 1
            report.node_seconds[node.name] = cost.time_s
            report.node_ops[node.name] = str(node.target)
            report.total_s += cost.time_s
            if node.meta.get("trex_moe") is not None:
                report.moe_nodes.add(node.name)
                report.moe_total_s += cost.time_s
    finally:
        for node in graph.nodes:
            node.meta.pop("cost", None)
            if node in saved:
                node.meta["cost"] = saved[node]
    return report


def emitted_call_costs(graph: fx.Graph, target: str) -> list[tuple[str, object]]:
    """The cost model's own price of every torch_npu call in a lowered graph, (op name, `NodeCost`) each: from the
    op's formula (`cost_model/torch_npu_formulas.py`) and the target's profile, not from the nodes it replaced.
    Every op the backend emits has a formula; a call priced 0 would under-count the share it is part of."""
    from trex.cost_model.annotate import annotate_node, cluster_of

    cluster = cluster_of(target)
    return [
        (node.meta["trex_npu_op"], annotate_node(node, cluster))
        for node in graph.nodes
        if node.op == "call_function" and "trex_npu_op" in node.meta
    ]


def describe(reports: list[AscendGraphReport]) -> list[str]:
    """Summary lines: the fused share of predicted time, overall and for the MoE layers."""
    reports = [r for r in reports if r.total_s > 0]
    if not reports:
        return []
    total = sum(r.total_s + r.glue_s for r in reports)
    fused = sum(r.fused_s for r in reports)
    moe_total = sum(r.moe_total_s + r.moe_glue_s for r in reports)
    moe_fused = sum(r.moe_fused_s for r in reports)
    target = reports[0].target
    glue = sum(r.glue_s for r in reports)
    line = (
        f"ascend: torch_npu fused ops take {100 * fused / total:.1f}% of the predicted time on {target} "
        f"({fused * 1e6:.1f} of {total * 1e6:.1f} us, which include {glue * 1e6:.1f} us of glue the rewrites added)"
    )
    if moe_total:
        line += f"; MoE layers: {100 * moe_fused / moe_total:.1f}% ({moe_fused * 1e6:.1f} of {moe_total * 1e6:.1f} us)"
    ops = Counter()
    for r in reports:
        ops.update(r.emitted)
    lines = [line, "ascend: emitted " + ", ".join(f"{name} x{count}" for name, count in sorted(ops.items()))]
    if ops["npu_grouped_matmul_add_"]:
        published = any(r.publishes_grads for r in reports)
        lines.append(
            f"ascend: {ops['npu_grouped_matmul_add_']} expert weight gradient(s) accumulate in place into float32 "
            + (
                "`main_grad` (npu_grouped_matmul_add_), published to .grad after each backward (fp32 parameters: "
                "the buffer itself; AscendBackend(main_grad=False) opts out)"
                if published
                else "`main_grad` (npu_grouped_matmul_add_; .grad stays None): zero them once per step with "
                "trex.backends.ascend.main_grad.zero_main_grads"
            )
        )
    for moe_only, what in ((True, "MoE layers"), (False, "whole graph")):
        left: Counter = Counter()
        for r in reports:
            left.update(r.unfused_by_op(moe_only=moe_only))
        top = [(op, s) for op, s in left.most_common(6) if s > 0]
        if top:
            listed = ", ".join(f"{op.removeprefix('aten.')} {s * 1e6:.1f} us" for op, s in top)
            lines.append(f"ascend: left unfused ({what}, largest first): {listed}")
    return lines
