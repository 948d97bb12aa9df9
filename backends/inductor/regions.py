"""Regional compilation: split a forward or backward graph at the model's decoder layers, compile each
structurally distinct layer once, and run the same compiled code for every layer that is identical to it.

Why: a transformer's layers are the same program on different weights, yet compiling the whole graph makes
Inductor lower, schedule and generate code for every layer again - on the tiny MoE models most of a cold
first call (bench/RESULTS.md section 11, fifth session: scheduler code generation and lowering were 39 of
Inductor's 75 s). A layer's region graph is keyed by its structure (ops, arguments, and the shape, stride,
dtype and device of every input); regions with equal keys share one compiled artifact, which is a function
of its inputs only (the regions of an AOTAutograd graph hold no constants: weights are inputs).

Which layer a node belongs to comes from `nn_module_stack` (forward) / `fwd_nn_module_stack` (backward) in
its meta; nodes without one (the model's embedding, final norm and head, nodes a pass inserted) join the
layer of their neighbours where they sit between two nodes of the same layer, or form regions of their own.
The nodes are then reordered (a topological order that keeps each layer's nodes together) and cut into
consecutive regions; any cut is correct, a good one only makes more regions equal.

The regions run from one boxed list of values: each region's inputs are taken from it and each value is
dropped after its last use, so a saved activation of the backward is freed as early as in the one-region
call (`lowering.boxed_single_region`).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

_LAYER = re.compile(r"layers(?:\.|\[|_)+(\d+)")


@dataclass
class Region:
    """One consecutive run of nodes of the split graph, as its own graph module."""

    graph: fx.GraphModule
    inputs: list[int]  # value slots it reads
    outputs: list[int]  # value slots it writes, in the order of its output tuple
    key: tuple  # structural key: equal keys, interchangeable compiled code
    layer: int | None


@dataclass
class RegionalPlan:
    """How a graph runs as regions: value slots 0..n-1 are the graph's inputs; `result` says where each of
    the graph's outputs comes from: ("slot", i) or ("constant", value)."""

    regions: list[Region]
    num_inputs: int
    result: list[tuple[str, Any]]
    single_output: bool
    free_after: list[list[int]] = field(default_factory=list)  # slots whose last reader is region i

    @property
    def distinct(self) -> int:
        return len({r.key for r in self.regions})


def layer_of(node: fx.Node) -> int | None:
    """The decoder layer index a node was traced in (innermost `layers.N` of its module stack), if any."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    found = None
    for key, value in stack.items():
        path = value[0] if isinstance(value, tuple) else str(key)
        match = _LAYER.findall(str(path))
        if match:
            found = int(match[-1])
    return found


def plan_regions(gm: fx.GraphModule) -> RegionalPlan | None:
    """The graph cut at its layers, or None when it cannot be (inputs that are not plain tensors, constants
    held by the module, or fewer than two layers that share a structure: nothing to reuse)."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if any(n.op not in ("placeholder", "call_function", "output") for n in gm.graph.nodes):
        return None
    if not all(isinstance(p.meta.get("val"), torch.Tensor) for p in placeholders):
        return None
    labels = _labels(nodes)
    if len({label for label in labels.values() if label is not None}) < 2:
        return None
    order = _grouped_order(gm, nodes, labels)
    _fill_between(order, labels)
    runs: list[list[fx.Node]] = []
    for node in order:
        if runs and labels[runs[-1][0]] == labels[node]:
            runs[-1].append(node)
        else:
            runs.append([node])
    plan = _build(gm, placeholders, runs, labels)
    if plan is None or plan.distinct == len(plan.regions):
        return None
    return plan


def _labels(nodes: list[fx.Node]) -> dict[fx.Node, int | None]:
    """Each node's layer, adjusted so that layers that are the same program get the same nodes:

    * a node with no inputs (an `iota`, a `full`) belongs to no layer: CSE leaves one such constant for all
      layers, computed in the first, which would make the first layer unlike the others;
    * a node read only by nodes of a layer that comes earlier in the graph moves to that layer: the backward
      recomputes layer k-1's output inside layer k's backward (which runs first), for every layer but the first.
    """
    labels = {n: layer_of(n) for n in nodes}
    for node in nodes:
        if not node.all_input_nodes:
            labels[node] = None
    first: dict[int | None, int] = {}
    for i, node in enumerate(nodes):
        first.setdefault(labels[node], i)
    for node in reversed(nodes):  # users first, so a recomputed chain moves as a whole
        own = labels[node]
        users = list(node.users)
        if own is None or not users or any(u not in labels for u in users):  # read by the graph's output: stays
            continue
        targets = {labels[u] for u in users}
        if len(targets) == 1:
            (target,) = targets
            if target is not None and first[target] < first[own]:
                labels[node] = target
    return labels


def _fill_between(order: list[fx.Node], labels: dict[fx.Node, int | None]) -> None:
    """An unlabelled node placed between two nodes of one layer (in the grouped order) joins that layer."""
    known = [(i, labels[n]) for i, n in enumerate(order) if labels[n] is not None]
    before: int | None = None
    position = 0
    for i, node in enumerate(order):
        while position < len(known) and known[position][0] < i:
            before = known[position][1]
            position += 1
        if labels[node] is None and position < len(known) and before is not None and known[position][1] == before:
            labels[node] = before


def _grouped_order(gm: fx.GraphModule, nodes: list[fx.Node], labels: dict[fx.Node, int | None]) -> list[fx.Node]:
    """A topological order of `nodes` in which each layer's nodes are as consecutive as dependencies allow:
    Kahn's algorithm that prefers the layer met first in the original order (ties: the original order)."""
    index = {n: i for i, n in enumerate(nodes)}
    rank: dict[Any, int] = {}
    for node in nodes:
        rank.setdefault(labels[node], len(rank))
    waiting = {n: sum(1 for a in n.all_input_nodes if a in index) for n in nodes}
    ready: dict[Any, list[int]] = {}  # layer -> heap of ready nodes' original positions
    for node in nodes:
        if waiting[node] == 0:
            heapq.heappush(ready.setdefault(labels[node], []), index[node])
    order: list[fx.Node] = []
    current: Any = None
    while any(ready.values()):
        if not ready.get(current):  # the current layer has no ready node: move to the first-met layer that has
            current = min(
                (label for label, heap in ready.items() if heap), key=lambda label: (rank[label], ready[label][0])
            )
        node = nodes[heapq.heappop(ready[current])]
        order.append(node)
        for user in node.users:
            if user in waiting:
                waiting[user] -= 1
                if waiting[user] == 0:
                    heapq.heappush(ready.setdefault(labels[user], []), index[user])
    assert len(order) == len(nodes), "the graph has a cycle"
    return order


def _build(
    gm: fx.GraphModule, placeholders: list[fx.Node], runs: list[list[fx.Node]], labels: dict
) -> RegionalPlan | None:
    slot = {p: i for i, p in enumerate(placeholders)}
    region_of = {n: k for k, run in enumerate(runs) for n in run}
    output = next(n for n in gm.graph.nodes if n.op == "output")
    single_output = not isinstance(output.args[0], (tuple, list))
    results = [output.args[0]] if single_output else list(output.args[0])
    read_by_output = {r for r in results if isinstance(r, fx.Node)}
    regions = []
    for k, run in enumerate(runs):
        members = set(run)
        inputs = list(dict.fromkeys(a for n in run for a in n.all_input_nodes if a not in members))
        outputs = [n for n in run if n in read_by_output or any(region_of.get(u, -1) != k for u in n.users)]
        if not outputs:
            continue  # dead code: nothing reads it
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for position, value in enumerate(inputs):
            placeholder = graph.placeholder(f"in_{position}")
            placeholder.meta = dict(value.meta)
            env[value] = placeholder
        for node in run:
            env[node] = graph.node_copy(node, env.__getitem__)
        graph.output(tuple(env[n] for n in outputs))
        region = fx.GraphModule(gm, graph)
        for value in outputs:
            slot[value] = len(slot)
        regions.append(
            Region(region, [slot[v] for v in inputs], [slot[v] for v in outputs], _key(region), labels[run[0]])
        )
    result = [("slot", slot[r]) if isinstance(r, fx.Node) else ("constant", r) for r in results]
    plan = RegionalPlan(regions, len(placeholders), result, single_output)
    last_reader: dict[int, int] = {}
    for k, region in enumerate(regions):
        for s in region.inputs:
            last_reader[s] = k
    kept = {s for kind, s in result if kind == "slot"}
    plan.free_after = [[] for _ in regions]
    for s, k in last_reader.items():
        if s not in kept:
            plan.free_after[k].append(s)
    return plan


def _key(region: fx.GraphModule) -> tuple:
    """Everything the compiled code of `region` depends on: each node's op, target and arguments (other nodes
    by position) and each input's shape, stride, storage offset, dtype and device."""
    position: dict[fx.Node, int] = {}
    parts: list[Any] = []

    def arg(value: Any) -> Any:
        if isinstance(value, fx.Node):
            return ("node", position[value])
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, tuple(arg(v) for v in value))
        if isinstance(value, dict):
            return ("dict", tuple((k, arg(v)) for k, v in value.items()))
        return (type(value).__name__, repr(value))

    for node in region.graph.nodes:
        position[node] = len(position)
        if node.op == "placeholder":
            val = node.meta["val"]
            parts.append(("in", tuple(val.shape), val.stride(), val.storage_offset(), val.dtype, val.device.type))
        else:
            parts.append((node.op, str(node.target), arg(node.args), arg(node.kwargs)))
    return tuple(parts)


def compile_regions(
    plan: RegionalPlan, compile_region: Callable[[fx.GraphModule, list[Any]], Callable[[list[Any]], Any]]
) -> tuple[Callable[[list[Any]], Any], list[str]]:
    """Compile each distinct region once with `compile_region(graph, example_inputs)` (a boxed callable:
    one list argument, which it may empty) and return a boxed runner of the whole graph plus one line per
    region (for the lowering's notes)."""
    compiled: dict[tuple, Callable[[list[Any]], Any]] = {}
    calls = []
    notes = []
    for k, region in enumerate(plan.regions):
        reused = region.key in compiled
        if not reused:
            examples = [p.meta["val"] for p in region.graph.graph.find_nodes(op="placeholder")]
            compiled[region.key] = compile_region(region.graph, examples)
        calls.append((compiled[region.key], region.inputs, region.outputs, plan.free_after[k]))
        nodes = sum(1 for n in region.graph.graph.nodes if n.op == "call_function")
        where = f"layer {region.layer}" if region.layer is not None else "outside the layers"
        notes.append(f"region {k} ({where}, {nodes} nodes): {'reuses an identical region' if reused else 'compiled'}")
    result = plan.result
    num_inputs = plan.num_inputs
    size = num_inputs + sum(len(r.outputs) for r in plan.regions)

    def run(args: list[Any]) -> Any:
        values: list[Any] = list(args) + [None] * (size - num_inputs)
        args.clear()
        for call, inputs, outputs, free in calls:
            region_args = [values[s] for s in inputs]
            for s in free:  # this region reads them last: the region's boxed call frees each after its own last use
                values[s] = None
            produced = call(region_args)
            del region_args
            for s, value in zip(outputs, produced):
                values[s] = value
        return [values[i] if kind == "slot" else i for kind, i in result]

    return run, notes
