"""Do the two pricings agree? An annotated graph of one decoder layer against the spec's cost of that layer.

trex prices a training step twice: graph-side, every node of a captured joint graph gets a
`node.meta["cost"]` from `trex.cost_model.op_formulas` (what graph passes read); spec-side,
`layer_cost` prices a `LayerSpec` for the planner. Both describe the same forward + backward of one
decoder layer, so they must agree. `compare_layer` puts them side by side, class by class:

    gemm       weight GEMMs: a GEMM with a parameter among its operands (forward, data gradient) or
               whose result is a parameter's gradient (weight gradient); spec: its `Linear`s
    moe_gemm   routed experts' grouped GEMMs (`trex.grouped_mm`, its weight gradient, `aten._grouped_mm`,
               the GEMM share of fused `trex.moe_experts`); spec: `experts.grouped_mm`
    attention  fused attention ops, and GEMMs of two activations inside a module whose class is an
               attention module (QK^T, PV and their gradients in eager attention); spec: `AttentionCore`s

What is compared (`Agreement.disagreements`, each within `tolerance`, 2% by default):

* FLOPs of each class. Both sides count 2 FLOPs per multiply-accumulate, every GEMM the layer runs
  (forward, data and weight gradients), nothing else: the spec prices element-wise work by bytes, so the
  graph's element-wise FLOPs are reported (`other_flops`) but not compared.
* GEMM operand bytes of each class whose spec side defines them: A and B read and C written once at the
  GEMM's dtype (`layer_cost.gemm_operand_bytes`; the spec's main-gradient read-back is not an operand).
  The spec prices Megatron's fused projections (one QKV GEMM, one gate+up GEMM) where transformers runs
  `Linear.splits` separate ones; their extra input reads and partial input gradients are added to the
  spec side here (as transformers runs them), so each side counts the GEMMs the graph holds.
  Fused attention is priced by FLOPs on the spec side, so its bytes are compared only for unfused
  attention (the eager graph's batched GEMMs). Under a causal mask both sides count the keys a fused
  kernel computes, whole blocks on the diagonal (`AttentionModel.causal_keys`).
* Known difference: DeepSeek-V4's lightning-indexer scorer, which transformers runs per token in FP32
  with the compressed keys broadcast over the queries, where the spec prices a BF16 score GEMM over the
  heads: its attention bytes differ (FLOPs agree); the test names it.
* Not compared: memory-bound bytes. The spec prices each `Pointwise` as one fused kernel's HBM traffic,
  the graph prices every aten op it holds (a norm is several); both totals are reported
  (`memory_bytes`), their ratio is what fusion could save, not an error.

Like with like: the spec side is priced for the graph's shapes on one device (tp = cp = ep = 1, no
recompute, balanced routing, mbs = the graph's batch), with the attention kernel the graph holds
(`unfused` for eager attention). Where the classes disagree, `differing` names the ops: graph ops
grouped by the module that ran them and spec ops by name, after pairing those with equal cost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from trex.cost_model.annotate import NodeCost
from trex.cost_model.catalog import get_cluster
from trex.cost_model.cluster import Cluster
from trex.cost_model.devices import DTYPE_BYTES
from trex.cost_model.layer_cost import CostContext, layer_cost
from trex.cost_model.model_spec import LayerSpec
from trex.cost_model.op_formulas import formula_for, op_name
from trex.cost_model.parallel import ParallelConfig
from trex.errors import TrexError

CLASSES = ("gemm", "moe_gemm", "attention")
_GROUPED = frozenset(
    {
        "trex.grouped_mm",
        "trex.grouped_mm_weight_grad",
        "trex.extern_grouped_mm",
        "trex.extern_grouped_mm_weight_grad",
        "aten._grouped_mm",
        "aten._scaled_grouped_mm",
    }
)
_FUSED_EXPERTS = frozenset({"trex.moe_experts", "trex.moe_experts_backward"})
_MEMORY_KINDS = frozenset(
    {"pointwise", "reduction", "norm", "softmax", "loss", "gather_scatter", "copy", "creation", "sort", "moe"}
)
_PASS_THROUGH = frozenset({"view", "copy"})  # a parameter reaches a GEMM through views, casts and copies


@dataclass(frozen=True)
class Part:
    """One named contribution: a graph module's ops of one class, or one spec op."""

    name: str
    flops: float
    bytes: float


@dataclass
class ClassTotals:
    graph_flops: float = 0.0
    spec_flops: float = 0.0
    graph_bytes: float = 0.0
    spec_bytes: float = 0.0
    bytes_compared: bool = True

    @staticmethod
    def _ratio(graph: float, spec: float) -> float:
        if spec == 0:
            return 1.0 if graph == 0 else float("inf")
        return graph / spec

    @property
    def flops_ratio(self) -> float:
        return self._ratio(self.graph_flops, self.spec_flops)

    @property
    def bytes_ratio(self) -> float:
        return self._ratio(self.graph_bytes, self.spec_bytes)


@dataclass
class Agreement:
    """Graph-side and spec-side cost of one layer, class by class (see the module docstring)."""

    layer: str
    classes: dict[str, ClassTotals]
    graph_parts: dict[str, list[Part]]
    spec_parts: dict[str, list[Part]]
    other_flops: float = 0.0  # graph FLOPs of element-wise, reduction and data-movement ops (not compared)
    memory_bytes: tuple[float, float] = (0.0, 0.0)  # (graph, spec) bytes of memory-bound ops (not compared)
    unpriced: dict[str, int] = field(default_factory=dict)

    def disagreements(self, tolerance: float = 0.02) -> list[str]:
        """One line per compared quantity off by more than `tolerance`, naming the ops that differ."""
        lines = []
        if self.unpriced:
            lines.append(f"{self.layer}: graph ops without a formula: {dict(self.unpriced)}")
        for name, totals in self.classes.items():
            checks = [("FLOPs", totals.graph_flops, totals.spec_flops, totals.flops_ratio)]
            if totals.bytes_compared:
                checks.append(("bytes", totals.graph_bytes, totals.spec_bytes, totals.bytes_ratio))
            for what, graph, spec, ratio in checks:
                if abs(ratio - 1.0) > tolerance:
                    graph_only, spec_only = self.differing(name, "flops" if what == "FLOPs" else "bytes")
                    lines.append(
                        f"{self.layer}: {name} {what} graph {graph:.6g} vs spec {spec:.6g} (x{ratio:.4f}); "
                        f"graph only: {_names(graph_only)}; spec only: {_names(spec_only)}"
                    )
        return lines

    def differing(self, name: str, quantity: str = "flops") -> tuple[list[Part], list[Part]]:
        """Parts of class `name` left once graph and spec parts of equal `quantity` are paired (to 0.1%)."""
        graph = list(self.graph_parts.get(name, []))
        spec_left = []
        for part in self.spec_parts.get(name, []):
            value = getattr(part, quantity)
            candidates = [g for g in graph if _close(getattr(g, quantity), value)]
            named = [g for g in candidates if _same_name(g.name, part.name)]
            match = (named or candidates or [None])[0]
            if match is None:
                spec_left.append(part)
            else:
                graph.remove(match)
        return graph, spec_left

    def describe(self) -> str:
        rows = [f"{self.layer}:"]
        for name, t in self.classes.items():
            bytes_text = (
                f"bytes {t.graph_bytes:.4g} vs {t.spec_bytes:.4g} (x{t.bytes_ratio:.3f})"
                if t.bytes_compared
                else "bytes not compared"
            )
            rows.append(
                f"  {name:<10} FLOPs {t.graph_flops:.4g} vs {t.spec_flops:.4g} (x{t.flops_ratio:.3f}); {bytes_text}"
            )
        graph_memory, spec_memory = self.memory_bytes
        rows.append(
            f"  memory-bound bytes graph {graph_memory:.4g} vs spec (fused) {spec_memory:.4g}; "
            f"element-wise FLOPs on the graph {self.other_flops:.4g} (not compared)"
        )
        return "\n".join(rows)


def _same_name(module_path: str, spec_name: str) -> bool:
    """`self_attn.o_proj` is spec op `o_proj`; `mlp.shared_experts.down_proj` is not `router`."""
    leaf = spec_name.split(".")[-1]
    return module_path in (spec_name, leaf) or module_path.endswith("." + leaf)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-3 * max(abs(a), abs(b), 1.0)


def _names(parts: Iterable[Part]) -> str:
    parts = list(parts)
    return ", ".join(f"{p.name} ({p.flops:.4g} FLOPs, {p.bytes:.4g} B)" for p in parts) if parts else "-"


def comparison_plan(seq: int, batch: int = 1, attention_kernel: str = "unfused") -> ParallelConfig:
    """The plan under which a layer's spec cost is comparable with its captured graph (one device)."""
    return ParallelConfig(
        seq=seq,
        mbs=batch,
        gbs=batch,
        dp=1,
        recompute="none",
        sequence_parallel=False,
        attention_kernel=attention_kernel,
        moe_imbalance=1.0,
    )  # type: ignore[arg-type]


def spec_parts(
    layer: LayerSpec, hidden: int, plan: ParallelConfig, cluster: Cluster | None = None
) -> tuple[dict[str, list[Part]], float]:
    """(class -> the spec's priced parts, memory-bound bytes) of `layer` under `plan`, from `layer_cost`."""
    ctx = CostContext.of(plan, cluster or get_cluster("h100"), detail=True)
    cost = layer_cost(layer, hidden, ctx)
    linears = {lin.name: lin for lin in layer.linears}
    parts: dict[str, list[Part]] = defaultdict(list)
    memory = 0.0
    for op in cost.ops:
        if op.category in CLASSES:
            nbytes = op.bytes
            lin = linears.get(op.name)
            if lin is not None and lin.splits > 1:
                # the reference runs `splits` GEMMs: each re-reads the input (forward, weight gradient) and
                # writes its own partial input gradient
                element = DTYPE_BYTES[ctx.gemm_dtype(lin.fp8, lin.dtype)]
                nbytes += (lin.splits - 1) * ctx.tokens * lin.in_features * element * (3 if lin.backward else 1)
            parts[op.category].append(Part(op.name, op.flops, nbytes))
        elif op.category == "pointwise":
            memory += op.bytes
    return dict(parts), memory


# ---------------------------------------------------------------------------------------------
# Graph side


def parameter_inputs(joint: fx.GraphModule, dynamo_graph: fx.GraphModule) -> set[str]:
    """Names of the joint graph's placeholders that are module parameters.

    AOTAutograd's joint graph takes Dynamo's graph inputs in order (each placeholder's `desc` says
    which); Dynamo names an input lifted from a module parameter `..._parameters_<name>_`."""
    dynamo_inputs = [n.name for n in dynamo_graph.graph.find_nodes(op="placeholder")]
    found = set()
    for node in joint.graph.find_nodes(op="placeholder"):
        index = getattr(node.meta.get("desc"), "idx", None)
        if not node.name.startswith("primals") or index is None or index >= len(dynamo_inputs):
            continue
        if "_parameters_" in dynamo_inputs[index]:
            found.add(node.name)
    return found


def _source(node: Any) -> Any:
    """Walk back through views and copies to where a value came from."""
    while isinstance(node, fx.Node) and node.op == "call_function":
        formula = formula_for(node.target)
        inputs = [a for a in node.args if isinstance(a, fx.Node)]
        if formula is None or formula.kind not in _PASS_THROUGH or len(inputs) != 1:
            break
        node = inputs[0]
    return node


def _parameter_gradients(joint: fx.GraphModule, parameters: set[str]) -> set[fx.Node]:
    """Nodes the joint graph returns as the gradient of a parameter (from the output's `desc`)."""
    output = joint.graph.find_nodes(op="output")[0]
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    descs = output.meta.get("desc") or []
    by_index = {getattr(p.meta.get("desc"), "idx", None): p.name for p in joint.graph.find_nodes(op="placeholder")}
    found = set()
    for value, desc in zip(values, descs):
        grad_of = getattr(desc, "grad_of", None)
        if isinstance(value, fx.Node) and by_index.get(getattr(grad_of, "idx", None)) in parameters:
            found.add(_source(value))
    return found


def _module_path(node: fx.Node) -> tuple[str, tuple[str, ...]]:
    """(the innermost module that ran this node, the class names of every module around it)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    entries = list(stack.values())
    if not entries:
        return "", ()
    path = str(entries[-1][0]).replace("L['self'].", "").replace("L['self']", "")
    classes = tuple(getattr(cls, "__name__", str(cls)) for _, cls in entries)
    return path, classes


def graph_class(node: fx.Node, cost: NodeCost, parameters: set[str], gradients: set[fx.Node]) -> str | None:
    """The compared class of a priced node (`CLASSES`), or None for everything else."""
    name = op_name(node.target)
    if name in _GROUPED or name in _FUSED_EXPERTS:
        return "moe_gemm"
    if cost.kind == "attention":
        return "attention"
    if cost.kind != "gemm":
        return None
    operands = [_source(a) for a in node.args if isinstance(a, fx.Node)]
    if any(o.op == "placeholder" and o.name in parameters for o in operands) or node in gradients:
        return "gemm"
    _, classes = _module_path(node)
    return "attention" if any("Attention" in c for c in classes) else None


def _fused_expert_gemms(cost: NodeCost) -> tuple[float, float]:
    """(FLOPs, operand bytes) of the grouped GEMMs inside fused `trex.moe_experts` (+ its backward)."""
    b = cost.bindings
    rows, hidden, fc1, inner, experts, element = b["S"], b["H"], b["M"], b["N"], b["E"], b["s_in"]
    flops = 2 * rows * hidden * fc1 + 2 * rows * inner * hidden
    gate_up = rows * hidden + experts * hidden * fc1 + rows * fc1
    down = rows * inner + experts * inner * hidden + rows * hidden
    nbytes = (gate_up + down) * element
    return (2 * flops, 2 * nbytes) if cost.op.endswith("backward") else (flops, nbytes)


def graph_parts(
    joint: fx.GraphModule, parameters: set[str]
) -> tuple[dict[str, list[Part]], float, float, dict[str, int]]:
    """(class -> parts by module, element-wise FLOPs, memory-bound bytes, unpriced ops) of an annotated joint graph."""
    gradients = _parameter_gradients(joint, parameters)
    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    other_flops = memory = 0.0
    unpriced: dict[str, int] = defaultdict(int)
    for node in joint.graph.nodes:
        cost = node.meta.get("cost")
        if not isinstance(cost, NodeCost):
            continue
        if not cost.priced:
            unpriced[cost.op] += 1
            continue
        kind = graph_class(node, cost, parameters, gradients)
        if kind is None:
            other_flops += cost.flops
            if cost.kind in _MEMORY_KINDS:
                memory += cost.bytes
            continue
        flops, nbytes = _fused_expert_gemms(cost) if cost.op in _FUSED_EXPERTS else (cost.flops, cost.bytes)
        path, _ = _module_path(node)
        entry = sums[kind][path or cost.op]
        entry[0] += flops
        entry[1] += nbytes
    parts = {kind: [Part(name, f, b) for name, (f, b) in by_module.items()] for kind, by_module in sums.items()}
    return parts, other_flops, memory, dict(unpriced)


def compare_layer(
    joint: fx.GraphModule,
    parameters: set[str],
    layer: LayerSpec,
    hidden: int,
    plan: ParallelConfig,
    cluster: Cluster | None = None,
    name: str = "",
) -> Agreement:
    """Compare an annotated joint graph of one layer (every node carrying `meta["cost"]`) with `layer_cost`."""
    if not any("cost" in n.meta for n in joint.graph.nodes):
        raise TrexError(
            "the graph carries no node.meta['cost']: run trex.cost_model.annotate.annotate(graph, target) first"
        )
    g_parts, other, g_memory, unpriced = graph_parts(joint, parameters)
    s_parts, s_memory = spec_parts(layer, hidden, plan, cluster)
    classes = {}
    for kind in CLASSES:
        totals = ClassTotals(
            sum(p.flops for p in g_parts.get(kind, [])),
            sum(p.flops for p in s_parts.get(kind, [])),
            sum(p.bytes for p in g_parts.get(kind, [])),
            sum(p.bytes for p in s_parts.get(kind, [])),
        )
        # fused attention: the spec prices FLOPs only (see the module docstring)
        totals.bytes_compared = not (kind == "attention" and plan.attention_kernel != "unfused")
        classes[kind] = totals
    return Agreement(name or layer.kind, classes, g_parts, s_parts, other, (g_memory, s_memory), unpriced)
