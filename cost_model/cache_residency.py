"""Which bytes an op of a graph reads from memory rather than from the cache: a reuse-distance model.

Why: a calibrated CPU profile measures each op back to back on the same buffers, so its per-op rates
(`op_bandwidth_gbs`, the cache model's first `cache_mib` per kernel) are rates of operands already in the
cache. In a step an op's inputs were mostly written by other ops long before (bench/RESULTS.md 15.18: the EP
rank's ops take 233 ms in the step against 175 ms run again at once), so they come back from memory. Whether
they do follows from the graph's order: under an LRU cache of C bytes, a read of a tensor of s bytes hits for
the part of it that the bytes of other tensors touched since its last touch (its reuse or LRU stack distance d,
Mattson et al., "Evaluation techniques for storage hierarchies", IBM Systems Journal 9(2), 1970) have not
pushed out: d + s - C bytes of it (clipped to [0, s]) are misses, all of it once d >= C. A graph's inputs are
first touched in the graph (compulsory misses: they were written before it ran, by the optimizer, the forward
or the caller). C is the profile's `cache_mib`, the per-core cache `trex calibrate` read from the machine; the
rate of a miss is the profile's measured streaming rate beyond that cache (`DeviceProfile.memory_time`'s).

A view (and a tuple's `getitem`) aliases its input's storage: it touches nothing itself, and a read through
it is a read of the base. Outputs are written into the cache (write-allocate), so they count towards the
distance of everything touched before them.
"""

from __future__ import annotations

import torch
from torch import fx

from trex.cost_model.op_formulas import formula_for, node_outputs


class _Fenwick:
    """Prefix sums over touch times: the bytes whose last touch is at each time (O(log n) update and query)."""

    def __init__(self, size: int):
        self.tree = [0.0] * (size + 1)

    def add(self, index: int, value: float) -> None:
        index += 1
        while index < len(self.tree):
            self.tree[index] += value
            index += index & -index

    def prefix(self, index: int) -> float:
        """Sum over times 0..index-1."""
        total = 0.0
        while index > 0:
            total += self.tree[index]
            index -= index & -index
        return total


def balanced_row_hints(graph: fx.Graph) -> dict:
    """Sizes for the graph's data-dependent row counts: an expert-parallel exchange's received rows (an unbacked
    size bound by `trex.ep_rows`) stand at the rows it sends, the balanced routing every EP price assumes
    (`op_formulas._bind_ep_exchange`)."""
    hints: dict = {}
    for node in graph.nodes:
        if node.op != "call_function" or str(node.target) != "trex.ep_exchange.default" or len(node.args) < 4:
            continue
        rows, received = node.args[0], node.args[3]
        sent = rows.meta.get("val").shape[0] if isinstance(rows, fx.Node) and "val" in rows.meta else None
        value = received.meta.get("val") if isinstance(received, fx.Node) else None
        if isinstance(sent, int) and isinstance(value, torch.SymInt):
            hints[value.node.expr] = sent
    return hints


def tensor_bytes(t: torch.Tensor, hints: dict) -> float:
    """A tensor's bytes; a data-dependent size takes its value from `hints` (0 where none is known: such a
    tensor is left out of the cache's contents rather than guessed)."""
    numel = t.numel()
    if isinstance(numel, torch.SymInt):
        if getattr(numel.node, "hint", None) is not None:  # a backed dynamic size: its example value
            return float(int(numel.node.hint) * t.element_size())
        expr = numel.node.expr.subs(hints)
        if not expr.is_number:
            return 0.0
        numel = int(expr)
    return float(numel * t.element_size())


def _is_view(node: fx.Node) -> bool:
    formula = formula_for(node.target) if node.op == "call_function" else None
    return formula is not None and formula.kind == "view"


def cold_read_bytes(graph: fx.Graph, cache_bytes: float) -> dict[fx.Node, float]:
    """For each call_function node of `graph`, the bytes of its tensor inputs that an LRU cache of
    `cache_bytes` no longer holds when it runs, the graph run in its order (0 where every input is resident).
    Each storage is counted once per node, however many of its inputs alias it."""
    if cache_bytes <= 0:
        raise ValueError(f"cache_bytes must be positive, got {cache_bytes}: pass the device's cache_mib * 2**20")
    nodes = list(graph.nodes)
    storage: dict[fx.Node, fx.Node] = {}  # node -> the node whose output holds its data (itself, or a view's base)
    size: dict[fx.Node, float] = {}  # storage -> bytes
    last: dict[fx.Node, int] = {}  # storage -> time of its last touch
    touches = _Fenwick(sum(len(node.all_input_nodes) + 1 for node in nodes) + 1)  # at most one touch each
    clock = 0
    resident = 0.0  # bytes of all storages touched so far (each at its last touch time)
    cold: dict[fx.Node, float] = {}
    hints = balanced_row_hints(graph)

    def touch(base: fx.Node) -> None:
        nonlocal clock, resident
        if base in last:
            touches.add(last[base], -size[base])
            resident -= size[base]
        last[base] = clock
        touches.add(clock, size[base])
        resident += size[base]
        clock += 1

    for node in nodes:
        if node.op == "placeholder" or node.op == "get_attr":
            storage[node] = node
            size[node] = sum(tensor_bytes(t, hints) for t in node_outputs(node))
            continue  # first touched where it is read: a compulsory miss
        if node.op != "call_function":
            continue
        bases: list[fx.Node] = []
        for arg in node.all_input_nodes:
            base = storage.get(arg)
            if base is not None and base not in bases and size.get(base, 0.0) > 0:
                bases.append(base)
        if _is_view(node):
            storage[node] = bases[0] if bases else node
            size.setdefault(storage[node], 0.0)
            continue
        missed = 0.0
        for base in bases:
            s = size[base]
            if base not in last:
                missed += s
                continue
            distance = resident - touches.prefix(last[base] + 1)  # bytes touched after it
            missed += min(s, max(0.0, distance + s - cache_bytes))
        cold[node] = missed
        for base in bases:
            touch(base)
        storage[node] = node
        size[node] = sum(tensor_bytes(t, hints) for t in node_outputs(node))
        if size[node] > 0:
            touch(node)
    return cold
