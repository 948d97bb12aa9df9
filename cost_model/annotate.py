"""Graph annotation: price every node of a captured fx graph and write `node.meta["cost"]`.

An analysis in the torch.fx sense: it reads shapes from `node.meta["val"]` (FakeTensors) and writes
a `NodeCost` per node, never mutating the graph. FLOPs and bytes come from the sympy formulas of
`trex.cost_model.op_formulas`; time from the target's performance models (tile-wave GEMMs, fused
attention, bandwidth-bound kernels, alpha-beta collectives over the cluster). A node whose op has no
formula gets a `NodeCost` with `priced=False` and is listed by name in the report: nothing is
silently priced at zero.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch import fx

from trex.cost_model import collectives
from trex.cost_model.cache_residency import cold_read_bytes
from trex.cost_model.catalog import get_cluster
from trex.cost_model.cluster import Cluster
from trex.cost_model.cpu_loops import node_loops
from trex.cost_model.cpu_rows import reduction_outputs, scalar_softmax_elements
from trex.cost_model.devices import DeviceProfile
from trex.cost_model.op_formulas import (
    COLLECTIVE_KIND,
    B,
    E,
    H,
    K,
    L_k,
    L_q,
    M,
    N,
    OpFormula,
    S,
    causal,
    formula_for,
    node_outputs,
    op_name,
    s_in,
)
from trex.cost_model.torch_npu_formulas import WEIGHT_GRAD_GEMMS, splits_k

DTYPE_NAMES = {torch.float32: "fp32", torch.float64: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class NodeCost:
    """What one node costs on the target. `formula` is FLOPs as a sympy expression of `bindings`."""

    op: str
    kind: str
    flops: float
    bytes: float
    time_s: float
    formula: sympy.Expr | None = None
    bytes_formula: sympy.Expr | None = None
    bindings: Mapping[str, float] = field(default_factory=dict)
    priced: bool = True
    note: str = ""
    cold_bytes: float = 0.0  # of its reads, not in the cache when it runs (trex.cost_model.cache_residency)

    def describe(self) -> str:
        if not self.priced:
            return f"{self.op}: no formula ({self.note})" if self.note else f"{self.op}: no formula"
        values = ", ".join(f"{k}={v:g}" for k, v in self.bindings.items())
        return f"flops = {self.formula}  [{values}]" if self.formula is not None else self.kind


@dataclass
class AnnotationReport:
    target: str
    nodes: int = 0
    priced: int = 0
    unpriced: Counter = field(default_factory=Counter)  # op name -> nodes without a formula
    flops_by_kind: Counter = field(default_factory=Counter)
    bytes_by_kind: Counter = field(default_factory=Counter)
    time_by_kind: Counter = field(default_factory=Counter)
    time_by_op: Counter = field(default_factory=Counter)
    count_by_op: Counter = field(default_factory=Counter)
    flops_by_op: Counter = field(default_factory=Counter)

    @property
    def total_flops(self) -> float:
        return float(sum(self.flops_by_kind.values()))

    @property
    def total_bytes(self) -> float:
        return float(sum(self.bytes_by_kind.values()))

    @property
    def total_time_s(self) -> float:
        return float(sum(self.time_by_kind.values()))

    def merge(self, other: AnnotationReport) -> None:
        self.nodes += other.nodes
        self.priced += other.priced
        for mine, theirs in (
            (self.unpriced, other.unpriced),
            (self.flops_by_kind, other.flops_by_kind),
            (self.bytes_by_kind, other.bytes_by_kind),
            (self.time_by_kind, other.time_by_kind),
            (self.time_by_op, other.time_by_op),
            (self.count_by_op, other.count_by_op),
            (self.flops_by_op, other.flops_by_op),
        ):
            mine.update(theirs)


def cluster_of(target: Any) -> Cluster:
    """A cluster for a target name (or a `trex.Target`), a device profile, or a cluster."""
    if isinstance(target, Cluster):
        return target
    if not isinstance(target, (str, DeviceProfile)) and isinstance(getattr(target, "name", None), str):
        target = target.name  # trex.targets.Target
    if isinstance(target, DeviceProfile):
        base = get_cluster("cpu" if target.name == "cpu" else "h100")
        return base.with_device(target)
    return get_cluster(target)


def _dtype(node: fx.Node, device: DeviceProfile) -> str:
    outputs = node_outputs(node)
    for t in outputs:
        name = DTYPE_NAMES.get(t.dtype)
        if name is not None:
            return name if device.supports(name) else ("bf16" if device.supports("bf16") else "fp32")
        if "float8" in str(t.dtype) and device.supports("fp8"):
            return "fp8"
    return "bf16" if device.supports("bf16") else "fp32"


def _group_size(
    node: fx.Node, groups: Mapping[str, Sequence[int]] | None, world_size: int | None
) -> tuple[int, tuple[int, ...] | None]:
    schema_names = [a.name for a in node.target._schema.arguments]
    values = dict(zip(schema_names, node.args))
    values.update(node.kwargs)
    name = values.get("group_name") or values.get("tag")
    if groups and name in groups:
        ranks = tuple(groups[name])
        return len(ranks), ranks
    if "group_size" in values and isinstance(values["group_size"], int):
        return int(values["group_size"]), None
    if name is not None:
        try:
            from torch.distributed.distributed_c10d import _resolve_process_group, get_process_group_ranks

            group = _resolve_process_group(name)
            ranks = tuple(get_process_group_ranks(group))
            return len(ranks), ranks
        except Exception:
            pass
    return (world_size or 0), None


def _gemm_time(node: fx.Node, name: str, values: dict, device: DeviceProfile, cold: float = 0.0) -> float:
    dtype = _dtype(node, device)
    if name in WEIGHT_GRAD_GEMMS:  # torch_npu's grouped GEMM accumulating into fp32: it multiplies its inputs' dtype
        dtype = _dtype(node.args[1], device)
    if S in values:  # grouped: S rows over E groups
        experts = max(1, int(values[E]))
        rows = values[S] / experts
        weight_grad = (
            splits_k(node, name)
            or name
            in (
                "trex.grouped_mm_weight_grad",
                "trex.extern_grouped_mm_weight_grad",
            )
            or (
                name == "aten._grouped_mm"
                and len(node_outputs(node)[0].shape) == 3
                and len(node.args[0].meta["val"].shape) == 2
                and len(node.args[1].meta["val"].shape) == 2
            )
        )
        if weight_grad:
            return device.gemm_time(values[K], values[N], rows, dtype, experts)
        return device.gemm_time(rows, values[N], values[K], dtype, experts)
    if cold > 0:
        return device.gemm_time_cold(values[M], values[N], values[K], dtype, int(values.get(B, 1)), cold)
    return device.gemm_time(values[M], values[N], values[K], dtype, int(values.get(B, 1)))


def _measured_name(node: fx.Node, device: DeviceProfile) -> str:
    """The most specific name the device has a measurement for: the overload called with a Python
    number (wrapped into a 0-d tensor on every call: `add.Tensor[scalar]`), the overload, else the op."""
    overload = str(node.target)
    if any(isinstance(a, (int, float)) and not isinstance(a, bool) for a in node.args[1:]):
        scalar = f"{overload}[scalar]"
        if scalar in device.op_overhead_us:
            return scalar
    if overload in device.op_overhead_us or overload in device.op_bandwidth_gbs:
        return overload
    return op_name(node.target)


# Copies that run as one TensorIterator kernel into an output laid out before it runs; other copies
# (cat, stack, the scatter-backs of slices) have kernels of their own.
_ITERATOR_COPIES = frozenset({"aten.clone", "aten._to_copy", "aten.copy", "aten.copy_", "aten.contiguous"})


def _loops(node: fx.Node, kind: str, name: str, device: DeviceProfile) -> tuple[int, int]:
    if not (device.row_overhead_ns or device.loop_call_overhead_ns):
        return 1, 1
    if kind == "pointwise":
        return node_loops(node, output_first=False)
    if kind == "copy" and name in _ITERATOR_COPIES:
        return node_loops(node, output_first=True)
    return 1, 1


_EXPERTS_OPS = (
    "trex.moe_experts",
    "trex.moe_experts_backward",
    "trex.ep_experts_local",
    "trex.ep_experts_local_input_backward",
    "trex.ep_experts_local_weight_backward",
)


def expert_gemm_seconds(name: str, values: Mapping, device: DeviceProfile, dtype: str) -> float:
    """The grouped GEMMs of a fused experts op (`_EXPERTS_OPS`) on the tile model: S rows over E experts, hidden
    H, gate_up width M, down width N (the formula's bindings)."""
    experts = max(1, int(values[E]))
    rows = values[S] / experts
    forward = device.gemm_time(rows, values[M], values[H], dtype, experts) + device.gemm_time(
        rows, values[H], values[N], dtype, experts
    )
    # the backward's halves: the data gradients multiply [rows, out] by each weight transposed (the forward's
    # row counts); the weight gradients reduce over the rows (K = rows per expert: a few rows make a short
    # main loop, the tile's fill and the weight-sized output dominate)
    data = device.gemm_time(rows, values[N], values[H], dtype, experts) + device.gemm_time(
        rows, values[H], values[M], dtype, experts
    )
    weight = device.gemm_time(values[H], values[M], rows, dtype, experts) + device.gemm_time(
        values[N], values[H], rows, dtype, experts
    )
    return {
        "trex.ep_experts_local_input_backward": data,
        "trex.ep_experts_local_weight_backward": weight,
    }.get(name, 2 * forward if name.endswith("backward") else forward)


def expert_row_bytes(name: str, values: Mapping, moved: float) -> float:
    """Of a fused experts op's bytes (its formula's), those of its rows (received, gathered, activated,
    scattered, their gradients): the rest is its weights (read; the weight-gradient half also writes their
    gradients), which its grouped GEMMs price."""
    weights = values[E] * values[H] * (values[M] + values[N]) * values.get(s_in, 4.0)
    if name == "trex.ep_experts_local_weight_backward":
        weights *= 2
    return max(moved - float(weights), 0.0)


def _time(
    node: fx.Node,
    formula: OpFormula,
    values: dict,
    flops: float,
    moved: float,
    cluster: Cluster,
    groups: Mapping[str, Sequence[int]] | None,
    world_size: int | None,
    cold: float = 0.0,
) -> tuple[float, str]:
    device = cluster.device
    kind = formula.kind
    name = op_name(node.target)
    measured = _measured_name(node, device)
    if kind in ("view", "sync"):
        return 0.0, ""
    if kind == "gemm" and name in device.op_overhead_us:
        # this implementation's fixed cost per call was measured (a CPU grouped GEMM loops over its groups):
        # that plus the arithmetic. Its bytes-per-second from the calibration is not a GEMM's bound. The measured
        # call includes its launches (one per group on a CPU), so the modelled ones beyond a single call's are
        # taken out: the launches are not counted twice.
        groups = max(1, int(values.get(E, 1)))
        dtype = _dtype(node, device)
        extra_launches = device.gemm_launch_s(dtype, groups) - device.gemm_launch_s(dtype)
        return _gemm_time(node, name, values, device) - extra_launches + device.overhead_s(name, kind), ""
    if kind == "gemm":
        return _gemm_time(node, name, values, device, cold), ""
    if kind == "attention":
        keys = values[L_k] * values[causal]
        backward = name.endswith("backward")
        return device.attention_time(flops, keys, backward), ""
    if kind == "moe" and name in _EXPERTS_OPS:
        gemms = expert_gemm_seconds(name, values, device, _dtype(node, device))
        cold = min(cold, moved)
        if name in device.op_overhead_us:
            # this op was measured (`calibrate.measure_expert_ops`): its fixed cost per call and the rate of
            # everything beside its GEMMs (index build, row gathers, activation, scatter, the weights' layout)
            # per byte of its row traffic, on operands in the cache. The graph's order leaves reads cold (the
            # weights, a graph input, first): the rows' at the memory's rate, the weights' packed at the memory's
            # rate instead of the cache's (`DeviceProfile.gemm_time_cold`)
            rows = expert_row_bytes(name, values, moved)
            weights = moved - rows
            cold_weights = min(cold, weights)
            packing = 0.0
            if cold_weights > 0 and device.cache_bandwidth_gbs > 0:
                packing = max(device.cold_read_s(cold_weights) - cold_weights / (device.cache_bandwidth_gbs * 1e9), 0.0)
            return gemms + packing + device.op_time(measured, kind, 0.0, rows, cold_bytes=cold - cold_weights), ""
        return gemms + device.memory_time(moved - cold, 6) + device.cold_read_s(cold), ""
    if kind == "moe":  # dispatch / combine: gathers, sorts and weighted sums
        return device.op_time(measured, kind, flops, moved, cold_bytes=cold), ""
    if kind == "collective":
        size, ranks = _group_size(node, groups, world_size)
        if size <= 1:
            return (0.0, "single-rank group") if size == 1 else (0.0, "group size unknown: pass groups= or world_size=")
        placement = cluster.placement(ranks) if ranks else cluster.strided_placement(size, 1)
        short = name.split(".")[-1]
        collective = COLLECTIVE_KIND.get(short)
        if collective is None:
            return 0.0, f"no cost model for collective {short}"
        buffer = values.get(sympy.Symbol("bytes_in"), moved)
        if collective == "all_gather":
            buffer = values.get(sympy.Symbol("bytes_out"), moved)
        elif collective == "all_to_all":
            buffer = values.get(sympy.Symbol("bytes_in"), moved)
        return collectives.collective_time(collective, buffer, placement), ""
    seconds = device.op_time(measured, kind, flops, moved, _loops(node, kind, name, device), cold_bytes=cold)
    return seconds + _row_seconds(node, kind, name, device), ""


def _row_seconds(node: fx.Node, kind: str, name: str, device: DeviceProfile) -> float:
    """What a CPU softmax or reduction pays per row beyond its bytes (`trex.cost_model.cpu_rows`)."""
    if kind == "softmax" and device.scalar_softmax_ns:
        elements, direction = scalar_softmax_elements(node, name, device.vector_lanes)
        return elements * device.scalar_softmax_ns.get(direction, 0.0) * 1e-9
    if kind == "reduction" and device.reduce_output_ns:
        outputs, layout = reduction_outputs(node, name)
        return max(outputs - 1.0, 0.0) * device.reduce_output_ns.get(layout, 0.0) * 1e-9
    return 0.0


def annotate_node(
    node: fx.Node,
    cluster: Cluster,
    groups: Mapping[str, Sequence[int]] | None = None,
    world_size: int | None = None,
    overrides: Mapping[str, float] | None = None,
    cold_bytes: float = 0.0,
) -> NodeCost | None:
    """The cost of one call_function node (None for placeholders and outputs).

    overrides: formula symbol name -> value, in place of what the node's shapes bind (a data-dependent size
    known after the fact, e.g. the rows an expert-parallel exchange really moved: `S`, `bytes_in`).
    cold_bytes: of its reads, the bytes not in the cache when it runs (`cache_residency.cold_read_bytes`):
    memory-bound ops read them at the memory's rate, a GEMM packs them at that rate before its arithmetic
    (`DeviceProfile.gemm_time_cold`; grouped GEMMs keep their measured calls); attention and collectives do not
    use it."""
    if node.op != "call_function":
        return None
    name = op_name(node.target)
    formula = formula_for(node.target)
    if formula is None:
        return NodeCost(name, "unpriced", 0.0, 0.0, 0.0, priced=False, note="no formula for this op")
    try:
        values = formula.bind(node)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as error:
        return NodeCost(
            name, formula.kind, 0.0, 0.0, 0.0, priced=False, note=f"cannot read shapes: {type(error).__name__}"
        )
    if values is None:
        return NodeCost(name, formula.kind, 0.0, 0.0, 0.0, priced=False, note="shapes unavailable (no FakeTensor meta)")
    if overrides:
        by_name = {symbol.name: symbol for symbol in formula.symbols}
        values.update({by_name.get(key, sympy.Symbol(key)): value for key, value in overrides.items()})
    if formula.kind == "attention" and values.get(causal, 1.0) < 1.0:
        # a causal square: the keys the target's fused kernel computes, whole blocks on the diagonal (as
        # `layer_cost` prices it), not the triangle alone
        values[causal] = cluster.device.attention.causal_keys(values[L_q]) / values[L_k]
    ordered = [float(values.get(symbol, 0.0)) for symbol in formula.symbols]
    flops, moved = (float(x) for x in formula.evaluate(*ordered))
    seconds, problem = _time(node, formula, values, flops, moved, cluster, groups, world_size, cold_bytes)
    if seconds > 0 and formula.kind in ("attention",):  # the per-call cost this device measured for this op kind
        device = cluster.device
        seconds += device.overhead_s(name, formula.kind) - device.kernel_overhead_s
    bindings = {symbol.name: values[symbol] for symbol in formula.symbols if symbol in values}
    if problem:
        return NodeCost(
            name, formula.kind, flops, moved, 0.0, formula.flops, formula.bytes, bindings, priced=False, note=problem
        )
    cold = min(cold_bytes, moved) if formula.kind not in ("attention", "collective", "view", "sync") else 0.0
    return NodeCost(
        name,
        formula.kind,
        flops,
        moved,
        seconds,
        formula.flops,
        formula.bytes,
        bindings,
        note=formula.note,
        cold_bytes=cold,
    )


def annotate(
    graph: fx.GraphModule | fx.Graph,
    target: str | DeviceProfile | Cluster = "cpu",
    *,
    groups: Mapping[str, Sequence[int]] | None = None,
    world_size: int | None = None,
) -> AnnotationReport:
    """Write `node.meta["cost"]` on every call_function node of `graph`; return the totals.

    groups: process-group name -> global ranks, for collectives whose group is not initialised in
    this process (the default: ranks 0..group_size-1 of the target cluster).

    On a device with a modelled cache (`cache_mib`, a calibrated CPU) a memory-bound op's reads that the
    graph's order has pushed out of the cache are priced at the memory's rate (`cache_residency`): the
    calibration's per-op rates are measured on operands in the cache. The graph is priced in its current
    order, so re-annotate after reordering it.
    """
    cluster = cluster_of(target)
    fx_graph = graph.graph if isinstance(graph, fx.GraphModule) else graph
    report = AnnotationReport(target=f"{cluster.name}:{cluster.device.name}")
    device = cluster.device
    cold = cold_read_bytes(fx_graph, device.cache_mib * 2**20) if device.cache_mib > 0 else {}
    for node in fx_graph.nodes:
        cost = annotate_node(node, cluster, groups, world_size, cold_bytes=cold.get(node, 0.0))
        if cost is None:
            continue
        node.meta["cost"] = cost
        report.nodes += 1
        if not cost.priced:
            report.unpriced[cost.op] += 1
            continue
        report.priced += 1
        report.flops_by_kind[cost.kind] += cost.flops
        report.bytes_by_kind[cost.kind] += cost.bytes
        report.time_by_kind[cost.kind] += cost.time_s
        report.time_by_op[cost.op] += cost.time_s
        report.count_by_op[cost.op] += 1
        report.flops_by_op[cost.op] += cost.flops
    return report
