"""How much of a graph's predicted time on the Ascend target went to torch_npu fused operators.

Every node of the graph the backend sees is priced on the target (`trex.cost_model.annotate`, the
cost stored as `node.meta["ascend_cost"]` so the pipeline's own `meta["cost"]` stays as it was).
After lowering, a region node counts as replaced when the rewrite removed it (its work is done by the
fused op); region nodes still needed elsewhere stay in the graph and count as not fused. Each emitted
torch_npu call is priced by its own formula (`cost_model/torch_npu_formulas.py`, the same the cost
model uses for a lowered graph), not as the nodes it replaced: on small, launch-bound graphs one fused
kernel costs far less than the several it stands for, and counting the replaced nodes would flatter the
fused ops. The aten glue a rewrite adds around a fused call (casts, transposes, masks) is priced too and
counts as not fused. So the share is the lowered graph's own split:
share = fused calls / (nodes left + fused calls + glue). `replaced_share` keeps the earlier accounting
(fused calls priced as the nodes they replaced) for comparison. MoE-layer nodes (tagged
`meta["trex_moe"]` by canonicalization) are also summed on their own; `unfused_by_op` says where the
rest of the time goes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from torch import fx

COST_KEY = "ascend_cost"
# a node a whole-graph rewrite emitted before pricing: the price of what it replaced (main_grad.py); for a
# torch_npu call that is only the earlier accounting (`replaced_share`), the share prices the call by its formula
REPLACED_COST = "trex_ascend_replaced_cost"


@dataclass
class AscendGraphReport:
    target: str
    phase: str = ""
    total_s: float = 0.0
    moe_total_s: float = 0.0
    removed_s: float = 0.0  # the graph nodes the post-partition fused calls replaced (removed from the graph)
    moe_removed_s: float = 0.0
    emitted_s: float = 0.0  # those fused calls, each priced by its own formula
    moe_emitted_s: float = 0.0
    prepared_s: float = 0.0  # torch_npu calls already in the priced graph (pre-AOT, main_grad), by their formulas
    moe_prepared_s: float = 0.0
    prepared_replaced_s: float = 0.0  # the same calls priced as what they replaced (the earlier accounting)
    moe_prepared_replaced_s: float = 0.0
    unpriced: int = 0
    node_seconds: dict[str, float] = field(default_factory=dict)  # node name -> predicted seconds
    node_ops: dict[str, str] = field(default_factory=dict)  # node name -> its op (e.g. "aten.bmm.default")
    replaced_seconds: dict[str, float] = field(default_factory=dict)  # prepared call -> price of what it replaced
    moe_nodes: set[str] = field(default_factory=set)
    fused_nodes: set[str] = field(default_factory=set)
    emitted: Counter = field(default_factory=Counter)
    glue_s: float = 0.0  # the aten glue the rewrites added (casts, views, masks), priced on the target
    moe_glue_s: float = 0.0
    glue_by_op: Counter = field(default_factory=Counter)  # op -> predicted seconds of the glue nodes
    glue_nodes: list[tuple[str, str, float, bool]] = field(default_factory=list)  # (name, op, seconds, in MoE)
    publishes_grads: bool = False  # main_grad accumulations that also set param.grad (see main_grad.py)

    def record_fused(self, nodes: set[str], emitted: list[str], calls: list[tuple[float, bool]] = ()) -> None:
        """`nodes`: graph nodes the fused ops took over (removed region nodes, and torch_npu calls that were
        already in the priced graph); `calls`: (own-formula seconds, in a MoE layer) of each call emitted here."""
        new = nodes - self.fused_nodes
        self.fused_nodes |= new
        for name in new:
            seconds, moe = self.node_seconds.get(name, 0.0), name in self.moe_nodes
            if name in self.replaced_seconds:  # a call emitted before pricing: in the graph at its own price
                self.prepared_s += seconds
                self.prepared_replaced_s += self.replaced_seconds[name]
                if moe:
                    self.moe_prepared_s += seconds
                    self.moe_prepared_replaced_s += self.replaced_seconds[name]
            else:
                self.removed_s += seconds
                self.moe_removed_s += seconds if moe else 0.0
        for seconds, moe in calls:
            self.emitted_s += seconds
            self.moe_emitted_s += seconds if moe else 0.0
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
    def fused_s(self) -> float:
        """Time of the torch_npu calls, each by its own formula."""
        return self.emitted_s + self.prepared_s

    @property
    def moe_fused_s(self) -> float:
        return self.moe_emitted_s + self.moe_prepared_s

    @property
    def lowered_s(self) -> float:
        """The lowered graph's predicted time: nodes left, fused calls (own formulas), glue."""
        return self.total_s - self.removed_s + self.emitted_s + self.glue_s

    @property
    def moe_lowered_s(self) -> float:
        return self.moe_total_s - self.moe_removed_s + self.moe_emitted_s + self.moe_glue_s

    @property
    def share(self) -> float:
        """Fused-op time over the lowered graph's time, every fused call priced by its own formula."""
        return self.fused_s / self.lowered_s if self.lowered_s else 0.0

    @property
    def moe_share(self) -> float:
        return self.moe_fused_s / self.moe_lowered_s if self.moe_lowered_s else 0.0

    def replaced_split(self, *, moe_only: bool = False) -> tuple[float, float]:
        """(fused, total) seconds as the earlier accounting had them: each fused call priced as the graph
        nodes it replaced (kept to compare with the sections of bench/RESULTS.md written before the change)."""
        if moe_only:
            fused = self.moe_removed_s + self.moe_prepared_replaced_s
            return fused, self.moe_total_s + self.moe_prepared_replaced_s - self.moe_prepared_s + self.moe_glue_s
        fused = self.removed_s + self.prepared_replaced_s
        return fused, self.total_s + self.prepared_replaced_s - self.prepared_s + self.glue_s

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
            replaced, own = node.meta.get(REPLACED_COST), node.meta.get("cost")
            npu_call = node.op == "call_function" and _is_npu_call(node)
            cost = own if npu_call and own is not None else replaced or own
            if node.op != "call_function" or cost is None:
                continue
            if npu_call:  # a torch_npu call emitted before pricing: its own formula counts
                report.replaced_seconds[node.name] = (replaced or cost).time_s
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


def _is_npu_call(node: fx.Node) -> bool:
    """A torch_npu call (or its emulation): emitted by a rewrite, or traced from a graph rewritten before AOT."""
    return "trex_npu_op" in node.meta or getattr(node.target, "namespace", None) in ("npu", "npu_emul")


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


def shares(reports: list[AscendGraphReport]) -> dict[str, float]:
    """The fused shares of several graphs' reports together: `moe` / `whole` (each fused call by its own
    formula) and `moe_replaced` / `whole_replaced` (the earlier accounting, calls priced as what they replaced)."""
    out = {}
    for key, moe_only in (("moe", True), ("whole", False)):
        fused = sum(r.moe_fused_s if moe_only else r.fused_s for r in reports)
        total = sum(r.moe_lowered_s if moe_only else r.lowered_s for r in reports)
        out[key] = fused / total if total else 0.0
        out[key + "_us"] = total * 1e6
        old = [r.replaced_split(moe_only=moe_only) for r in reports]
        old_total = sum(t for _, t in old)
        out[key + "_replaced"] = sum(f for f, _ in old) / old_total if old_total else 0.0
    return out


def describe(reports: list[AscendGraphReport]) -> list[str]:
    """Summary lines: the fused share of predicted time, overall and for the MoE layers."""
    reports = [r for r in reports if r.total_s > 0]
    if not reports:
        return []
    total = sum(r.lowered_s for r in reports)
    fused = sum(r.fused_s for r in reports)
    moe_total = sum(r.moe_lowered_s for r in reports)
    moe_fused = sum(r.moe_fused_s for r in reports)
    target = reports[0].target
    glue = sum(r.glue_s for r in reports)
    line = (
        f"ascend: torch_npu fused ops take {100 * fused / total:.1f}% of the predicted time on {target}, each "
        f"priced by its own formula ({fused * 1e6:.1f} of {total * 1e6:.1f} us, which include {glue * 1e6:.1f} us "
        "of glue the rewrites added)"
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
