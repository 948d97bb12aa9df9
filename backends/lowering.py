"""Lowering: split a graph among backends by what each supports, and let each lower its parts.

Every call node goes to the first backend, in the user's priority order, whose `supports(node)`
says yes; the eager backend takes the rest. Connected groups of one backend's nodes become
submodules (without creating cycles) that the backend lowers; the eager glue runs them in order.
"""

from __future__ import annotations

import operator
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from trex.backends.backend import WHOLE_GRAPH, Backend
from trex.backends.eager import EagerBackend
from trex.errors import BackendError
from trex.graph_copy import copy_graph_module


@dataclass
class Lowering:
    """The result of lowering one graph: what runs, and who runs which node."""

    module: Callable[..., Any]
    assignment: dict[str, str]  # node name -> backend name
    partitions: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (backend, submodule, nodes)
    notes: list[str] = field(default_factory=list)  # e.g. a supports() that raised
    region_seconds: dict[str, float] = field(default_factory=dict)  # submodule -> its backend's lower() time
    predicted_seconds: dict[str, float] = field(default_factory=dict)  # backend -> cost-model time of its nodes
    boxed: Callable[[list[Any]], Any] | None = None  # the whole graph as one region, called boxed (see below)

    def counts(self) -> Counter:
        return Counter(self.assignment.values())

    def brief(self) -> str:
        """One line: per backend its nodes, predicted time, regions and compile time."""
        parts = []
        for backend, count in sorted(self.counts().items(), key=lambda item: -item[1]):
            regions = [sub for b, sub, _ in self.partitions if b == backend]
            text = f"{backend} {count} nodes"
            if backend in self.predicted_seconds:
                text += f", {self.predicted_seconds[backend] * 1e3:.2f} ms predicted"
            if regions:
                seconds = sum(self.region_seconds.get(r, 0.0) for r in regions)
                text += f", {len(regions)} region(s) compiled in {seconds:.1f} s"
            parts.append(text)
        return "; ".join(parts) if parts else "no nodes"

    def describe(self) -> str:
        lines = ["nodes per backend: " + ", ".join(f"{b}={n}" for b, n in sorted(self.counts().items()))]
        if self.predicted_seconds:
            predicted = ", ".join(f"{b}={s * 1e3:.3f} ms" for b, s in sorted(self.predicted_seconds.items()))
            lines.append(f"predicted time per backend: {predicted}")
        for backend, submodule, nodes in self.partitions:
            took = f" (compiled in {self.region_seconds[submodule]:.2f} s)" if submodule in self.region_seconds else ""
            listed = ", ".join(nodes[:12]) + (" ..." if len(nodes) > 12 else "")
            lines.append(f"{submodule} -> {backend}: {len(nodes)} nodes{took}: {listed}")
        lines += [f"note: {n}" for n in self.notes]
        eager = [name for name, b in self.assignment.items() if b == EagerBackend.name]
        lines.append(f"eager: {len(eager)} nodes")
        return "\n".join(lines)


class _AssignedTo(OperatorSupportBase):
    def __init__(self, nodes: set[fx.Node]):
        self.nodes = nodes

    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        return node in self.nodes


class LoweredSubgraph(torch.nn.Module):
    """A backend's compiled callable in place of the submodule it was lowered from."""

    def __init__(self, backend: str, compiled: Callable[..., Any], source: fx.GraphModule):
        super().__init__()
        self.backend = backend
        self.compiled = compiled
        self.source = source  # kept for dumps and debugging

    def forward(self, *args):
        return self.compiled(*args)


class BackendSupportsWarning(UserWarning):
    """A backend's supports() raised (its contract says it never does); trex treated it as False."""


def _safe_supports(backend: Backend, node: fx.Node, notes: list[str], raised: dict[str, list[str]]) -> bool:
    try:
        return bool(backend.supports(node))
    except Exception as error:  # noqa: BLE001 - the contract says never raise; trex tolerates it
        notes.append(
            f"backend {backend.name!r}: supports({node.name}) raised {type(error).__name__}: {error}; treated as False"
        )
        raised.setdefault(backend.name, []).append(f"{node.name}: {type(error).__name__}: {error}")
        return False


def assign_nodes(gm: fx.GraphModule, backends: Sequence[Backend]) -> tuple[dict[fx.Node, Backend], list[str]]:
    """The backend of every call node: the first in priority order that supports it."""
    notes: list[str] = []
    eager = next((b for b in backends if b.name == EagerBackend.name), EagerBackend())
    assignment = {}
    raised: dict[str, list[str]] = {}
    groups: dict[str, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        assignment[node] = next(
            (b for b in backends if b is not eager and _safe_supports(b, node, notes, raised)), eager
        )
        if "fusion_group" in node.meta:
            groups.setdefault(node.meta["fusion_group"], []).append(node)
    # A fusion group (passes/cost_driven_fusion.py) goes whole to the first code-generating backend that
    # supports all of it; when none does, its nodes stay with the backends that took them one by one.
    for name, members in groups.items():
        if len({assignment[n] for n in members}) == 1:
            continue
        whole = (b for b in backends if b is not eager and all(_safe_supports(b, n, notes, raised) for n in members))
        backend = next(whole, None)
        if backend is None:
            split = sorted({assignment[n].name for n in members})
            notes.append(
                f"fusion group {name} ({len(members)} nodes): no backend supports all of it; split among {split}"
            )
            continue
        notes.append(f"fusion group {name} ({len(members)} nodes) kept whole: all of it goes to {backend.name!r}")
        for member in members:
            assignment[member] = backend
    for name, failures in raised.items():
        warnings.warn(
            f"backend {name!r}: supports() raised on {len(failures)} node(s) (first: {failures[0]}); trex treated them as "
            "unsupported, so other backends run them. A backend's supports() must return False, never raise.",
            BackendSupportsWarning,
            stacklevel=2,
        )
    return assignment, notes


def predicted_seconds_per_backend(assignment: dict[fx.Node, Backend], target: Any) -> dict[str, float]:
    """The cost model's time for the nodes each backend took (unpriced nodes count zero)."""
    from trex.cost_model.annotate import annotate_node, cluster_of

    cluster = cluster_of(target)
    totals: dict[str, float] = {}
    for node, backend in assignment.items():
        try:
            cost = node.meta.get("cost") or annotate_node(node, cluster)  # priced by a pass already, or now
        except Exception:  # noqa: BLE001 - pricing is a report; an op it cannot price costs nothing here
            cost = None
        seconds = cost.time_s if cost is not None and cost.priced else 0.0
        totals[backend.name] = totals.get(backend.name, 0.0) + seconds
    return totals


def lower_graph(
    gm: fx.GraphModule,
    backends: Sequence[Backend],
    target: Any = None,
    *,
    phase: str = "",
    graph_inputs: Sequence[Any] | None = None,
) -> Lowering:
    """Lower a copy of `gm` across `backends`; the eager backend is always the last resort.

    With a `target` (name or `trex.Target`), the report carries each backend's predicted time.
    Each backend's `prepare` rewrites the copy first (see `Backend.prepare` for `phase`, `graph_inputs`).
    """
    gm = copy_graph_module(gm)
    for backend in backends:
        prepare = getattr(backend, "prepare", None)  # duck-typed plugins may not have it
        if prepare is not None:
            prepare(gm, phase, graph_inputs)
    assignment, notes = assign_nodes(gm, backends)
    names = {node.name: backend.name for node, backend in assignment.items()}
    eager = EagerBackend()
    lowering = Lowering(module=gm, assignment=names, notes=notes)
    if target is not None:
        lowering.predicted_seconds = predicted_seconds_per_backend(assignment, target)
    whole = _whole_graph_backend(gm, assignment)
    if whole is not None:  # one backend took every node: the graph is its one region, no glue graph around it
        gm.meta[WHOLE_GRAPH] = True  # its inputs are the graph's, checked before it runs (backends.backend)
        _lower_region(lowering, whole, f"trex_{whole.name}_0", gm)
        compiled = lowering.module
        lowering.boxed = getattr(compiled, "boxed", None)
        return lowering
    for backend in dict.fromkeys(b for b in assignment.values() if b.name != EagerBackend.name):
        nodes = {n for n, b in assignment.items() if b is backend}
        partitioner = CapabilityBasedPartitioner(gm, _AssignedTo(nodes), allows_single_node_partition=True)
        partitions = partitioner.propose_partitions()
        if not partitions:
            continue
        before = set(gm._modules)
        gm = partitioner.fuse_partitions(partitions, prefix=f"trex_{backend.name}_")
        for submodule_name in sorted(set(gm._modules) - before):
            submodule = getattr(gm, submodule_name)
            compiled = _lower_region(lowering, backend, submodule_name, submodule)
            setattr(gm, submodule_name, LoweredSubgraph(backend.name, compiled, submodule))
        gm.recompile()
    lowering.module = eager.lower(gm, [p.meta.get("val") for p in gm.graph.find_nodes(op="placeholder")])
    lowering.boxed = boxed_single_region(gm)
    return lowering


def _whole_graph_backend(gm: fx.GraphModule, assignment: dict[fx.Node, Backend]) -> Backend | None:
    """The backend that took every node of `gm`, when one code-generating backend did; else None."""
    backends = set(assignment.values())
    if len(backends) != 1:
        return None
    (backend,) = backends
    return backend if backend.name != EagerBackend.name else None


def _lower_region(lowering: Lowering, backend: Backend, name: str, region: fx.GraphModule) -> Callable[..., Any]:
    """`backend.lower` on one region, timed and recorded in `lowering` (the whole graph's region becomes
    `lowering.module`)."""
    example_inputs = [p.meta.get("val") for p in region.graph.find_nodes(op="placeholder")]
    start = time.perf_counter()
    try:
        compiled = backend.lower(region, example_inputs)
    except Exception as error:  # noqa: BLE001
        raise BackendError(
            f"backend {backend.name!r} failed to lower {name} ({len(region.graph.nodes)} nodes) it said it supports: {error}"
        ) from error
    if not callable(compiled):
        raise BackendError(f"backend {backend.name!r}.lower returned {type(compiled).__name__}, not a callable")
    lowering.region_seconds[name] = time.perf_counter() - start
    builds = getattr(compiled, "trex_kernel_builds", None)  # kernels still building: their wait is compile time
    if builds is not None and builds.pending:
        builds.on_finish.append(lambda seconds: _add_seconds(lowering.region_seconds, name, seconds))
    lowering.notes += [f"{name}: {note}" for note in getattr(compiled, "trex_notes", [])]
    lowering.partitions.append((backend.name, name, [n.name for n in region.graph.nodes if n.op == "call_function"]))
    if lowering.module is region:
        lowering.module = compiled
    return compiled


def _add_seconds(seconds_by_region: dict[str, float], name: str, seconds: float) -> None:
    seconds_by_region[name] = seconds_by_region.get(name, 0.0) + seconds


def boxed_single_region(gm: fx.GraphModule) -> Callable[[list[Any]], Any] | None:
    """When the lowered graph is one backend region and nothing else (the default: all of the forward,
    or all of the backward, to Inductor), a boxed callable (one list argument, which it empties) that
    runs the region without the glue graph in between; None otherwise, or when the backend's compiled
    region has no boxed entry (`compiled.boxed`).

    Why: AOTAutograd hands a compiled graph its inputs as one list it may empty. The glue graph's
    frame holds every input until the graph returns, so the backward's saved activations would all
    live to its end; a region called with the list itself releases each one after its last use, as
    `torch.compile` does (and one Python frame less per call).
    """
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    calls = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    regions = [n for n in calls if n.op == "call_module" and isinstance(getattr(gm, n.target), LoweredSubgraph)]
    if len(regions) != 1:
        return None
    region = regions[0]
    boxed = getattr(getattr(gm, region.target).compiled, "boxed", None)
    getitems = [n for n in calls if n is not region]
    if boxed is None or any(n.target is not operator.getitem or n.args[0] is not region for n in getitems):
        return None
    if any(not isinstance(a, fx.Node) or a.op != "placeholder" for a in region.args) or region.kwargs:
        return None
    position = {p: i for i, p in enumerate(placeholders)}
    inputs = [position[a] for a in region.args]
    (result,) = gm.graph.find_nodes(op="output")[0].args
    if result is region:  # the region's value is the graph's value
        plan: Any = None
    elif isinstance(result, (tuple, list)):
        # each output: ("region", index) | ("input", placeholder position) | ("constant", value)
        plan = []
        for item in result:
            if isinstance(item, fx.Node) and item in getitems:
                plan.append(("region", item.args[1]))
            elif isinstance(item, fx.Node) and item.op == "placeholder":
                plan.append(("input", position[item]))
            elif isinstance(item, fx.Node):
                return None
            else:
                plan.append(("constant", item))
    else:
        return None

    def run(args: list[Any]) -> Any:
        kept = {} if plan is None else {i: args[i] for kind, i in plan if kind == "input"}
        region_args = [args[i] for i in inputs]
        args.clear()
        outputs = boxed(region_args)
        if plan is None:
            return outputs
        return [outputs[i] if kind == "region" else kept[i] if kind == "input" else i for kind, i in plan]

    return run
