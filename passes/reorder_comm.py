"""The `reorder_comm` pass: hide communication under compute, from the cost model's per-node times.

A rank's captured graph runs its collectives as start / wait pairs (`_c10d_functional.*` and
`trex.ep_exchange` start one; `_c10d_functional.wait_tensor` completes it). Between the two the link
works while the rank computes; whatever part of the transfer is still running at the wait is exposed.
The pass reschedules the graph (a list scheduler over its data dependences) so that:

- every collective is issued as soon as its inputs exist (all-gather prefetch, early gradient
  reductions), unless the extra memory that holds its buffer earlier would pass the budget;
- every wait is as late as its users allow, and compute that does not depend on a pending transfer
  is pulled in front of the wait while the transfer would otherwise be exposed (within the budget);
- in a joint graph's backward, the weight gradients (what only the output reads) may be held back so the
  data gradients reach the next collective sooner and the weight gradients fill the waits (kept when the
  timeline exposes less; `weight_gradient_nodes`);
- latency-bound collectives of the same kind and group whose inputs are ready together are issued as
  one coalesced collective when the alpha-beta model says the saved latencies pay;
- the order in which collectives are issued is the original one, on every rank: the pass never
  reorders two collectives (the deadlock-freedom invariant, checked after the rewrite, and across the
  ranks of an initialised process group through its store).

Time comes from `node.meta["cost"]` (the cost model; nodes without it are priced first, on the target's
cluster, or on the emulated link when `TREX_EMULATE_LINK` is set). The same simulation (one compute
stream, one serial link) predicts the exposed communication before and after; both go in the decisions, with
the least any order-keeping schedule could expose on that model (`exposure_bound`).
"""

from __future__ import annotations

import hashlib
import heapq
import math
import operator
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import fx

from trex.errors import TrexError
from trex.pass_manager import Decision, PassContext, PassResult

BUDGET_OPTION = "comm_memory_budget_bytes"  # PassContext.options key (trex.compile(..., options=...))
HEADROOM_OPTION = "plan_memory_headroom_bytes"  # a plan's predicted free device memory, when the caller has one
TRAINING_STATE_PER_PARAMETER = 4  # parameter, gradient and AdamW's two moments, each the parameter's size
BLOCKING_COLLECTIVES = ("trex.ep_counts",)  # collectives that complete inside their own node


class CollectiveOrderError(TrexError):
    """The rewrite changed the order in which this rank issues collectives, or ranks disagree on it."""


def _name(node: fx.Node) -> str:
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return packet._qualified_op_name.replace("::", ".")
    return str(target)


def is_wait(node: fx.Node) -> bool:
    return node.op == "call_function" and _name(node) == "_c10d_functional.wait_tensor"


def is_start(node: fx.Node) -> bool:
    """A node that starts an asynchronous collective (its result is ready at a later wait_tensor)."""
    if node.op != "call_function":
        return False
    name = _name(node)
    return (name.startswith("_c10d_functional.") and not is_wait(node)) or name == "trex.ep_exchange"


def is_blocking_collective(node: fx.Node) -> bool:
    return node.op == "call_function" and _name(node) in BLOCKING_COLLECTIVES


def is_collective(node: fx.Node) -> bool:
    return is_start(node) or is_blocking_collective(node)


def _group_of(node: fx.Node) -> str:
    names = [a.name for a in node.target._schema.arguments]
    values = dict(zip(names, node.args))
    values.update(node.kwargs)
    return _group_shape(str(values.get("group_name", values.get("tag", "?"))))


def _group_shape(name: str) -> str:
    """A process group as every rank of a device mesh can agree on it: its size and the steps between its sorted
    global ranks (a mesh dim's groups all have the same: ep {0,1} and {2,3} are "2:1", their replicas {0,2} and
    {1,3} "2:2"). Group *names* are not that: each rank names the group it belongs to, so the ranks of different
    groups of one mesh dim hold different names. The name itself where it resolves to no group of this process."""
    import torch.distributed as dist

    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        ranks = sorted(dist.get_process_group_ranks(_resolve_process_group(name)))
    except (RuntimeError, ValueError, KeyError, AttributeError):
        return name
    return f"{len(ranks)}:{','.join(str(b - a) for a, b in zip(ranks, ranks[1:]))}"


def collective_signature(node: fx.Node) -> str:
    """What every rank must agree on for one collective: op, group and the buffers' dtypes."""
    dtypes = []
    for arg in node.args:
        for item in arg if isinstance(arg, (list, tuple)) else [arg]:
            value = item.meta.get("val") if isinstance(item, fx.Node) else None
            if isinstance(value, torch.Tensor):
                dtypes.append(str(value.dtype).replace("torch.", ""))
    return f"{_name(node)}@{_group_of(node)}[{','.join(dtypes)}]"


def collective_sequence(graph: fx.Graph) -> list[str]:
    """The collectives in issue order; a coalesced start counts once per bucketed member (`bucketed` meta)."""
    sequence = []
    for node in graph.nodes:
        if is_collective(node):
            members = node.meta.get("reorder_comm_members")
            sequence.extend(members if members else [collective_signature(node)])
    return sequence


def check_same_order(before: list[str], after: list[str]) -> None:
    if before != after:
        first = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
        raise CollectiveOrderError(
            f"reorder_comm changed the collective order at position {first}: "
            f"{before[first : first + 2]} became {after[first : first + 2]} "
            f"({len(before)} vs {len(after)} collectives); ranks could deadlock. Run with TREX_PASSES=-reorder_comm "
            "and report this graph"
        )


def _seconds(node: fx.Node) -> float:
    cost = node.meta.get("cost")
    return float(cost.time_s) if cost is not None and getattr(cost, "priced", False) else 0.0


def _out_bytes(node: fx.Node) -> int:
    cached = node.meta.get("reorder_comm_bytes")
    if cached is None:
        cached = node.meta["reorder_comm_bytes"] = _static_bytes(node)
    return cached


def _static_bytes(node: fx.Node) -> int:
    value = node.meta.get("val")
    total = 0
    for t in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(t, torch.Tensor):
            try:
                total += int(t.numel()) * t.element_size()
            except (TypeError, ValueError, RuntimeError):  # a data-dependent size: no static bound
                pass
    return total


def _inputs(node: fx.Node) -> list[fx.Node]:
    return list(dict.fromkeys(node.all_input_nodes))


# ---------------------------------------------------------------------------------------------
# the timing model: one compute stream, one serial link per process


@dataclass
class Timeline:
    """Simulated times of one schedule."""

    step_s: float = 0.0
    exposed_s: float = 0.0
    comm_s: float = 0.0
    exposed_by_start: dict[str, float] = field(default_factory=dict)
    hidden_by: dict[str, list[str]] = field(default_factory=dict)  # start -> compute nodes that ran under it
    spans: list[tuple[str, float, float, float]] = field(default_factory=list)  # (collective, issued, begun, done)


def simulate(order: Iterable[fx.Node]) -> Timeline:
    """Run the schedule on the model: compute nodes take their time; a start hands its transfer to the link
    (which is busy with one transfer at a time); a wait stalls compute until its transfer is done."""
    timeline = Timeline()
    now, link_free = 0.0, 0.0
    done_at: dict[fx.Node, float] = {}
    running: dict[fx.Node, list[str]] = {}
    for node in order:
        if node.op != "call_function":
            continue
        seconds = _seconds(node)
        if is_start(node):
            begin = max(now, link_free)
            link_free = begin + seconds
            done_at[node] = link_free
            running[node] = []
            timeline.comm_s += seconds
        elif is_blocking_collective(node):
            begin = max(now, link_free)
            timeline.exposed_s += begin + seconds - now
            timeline.exposed_by_start[node.name] = begin + seconds - now
            now = link_free = begin + seconds
            timeline.comm_s += seconds
        elif is_wait(node):
            start = _start_of(node)
            if start in done_at:
                stall = max(0.0, done_at[start] - now)
                timeline.exposed_s += stall
                timeline.exposed_by_start[start.name] = timeline.exposed_by_start.get(start.name, 0.0) + stall
                timeline.hidden_by[start.name] = running.pop(start, [])
                now += stall
        else:
            now += seconds
            if seconds > 0:
                for names in running.values():
                    names.append(node.name)
    timeline.step_s = now
    return timeline


def _start_of(wait: fx.Node) -> fx.Node | None:
    """The start node a wait completes (through the getitem of a coalesced start)."""
    source = wait.args[0] if wait.args else None
    while isinstance(source, fx.Node) and not is_start(source) and source.op == "call_function":
        if _name(source) in ("operator.getitem", "_operator.getitem", "<built-in function getitem>"):
            source = source.args[0]
        else:
            return None
    return source if isinstance(source, fx.Node) and is_start(source) else None


def simulate_ranks(order: Iterable[fx.Node], seconds_by_rank: list[dict[fx.Node, float]]) -> list[Timeline]:
    """`simulate` for every rank of the group at once: each runs the same schedule (the graph is the same on every
    rank) with its own node times (`seconds_by_rank[r]`: node -> seconds where they differ from
    `node.meta["cost"]`, e.g. the local experts of a rank that received more rows). A collective cannot begin
    before the last rank has issued it, so a rank that is ahead waits for the slower one; then its transfer
    takes this rank's link time, after the transfer before it on this rank's link. With one rank and no
    overrides it is `simulate`."""
    ranks = len(seconds_by_rank)
    timelines = [Timeline() for _ in range(ranks)]
    now, link_free = [0.0] * ranks, [0.0] * ranks
    done_at: list[dict[fx.Node, float]] = [{} for _ in range(ranks)]
    running: list[dict[fx.Node, list[str]]] = [{} for _ in range(ranks)]
    for node in order:
        if node.op != "call_function":
            continue
        own = _seconds(node)
        seconds = [times.get(node, own) for times in seconds_by_rank]
        if is_start(node) or is_blocking_collective(node):
            issued = max(now)  # the collective starts when every rank has issued it
            for r, timeline in enumerate(timelines):
                begin = max(issued, link_free[r])
                timeline.spans.append((node.name, now[r], begin, begin + seconds[r]))
                link_free[r] = begin + seconds[r]
                timeline.comm_s += seconds[r]
                if is_start(node):
                    done_at[r][node], running[r][node] = link_free[r], []
                else:
                    stall = link_free[r] - now[r]
                    timeline.exposed_s += stall
                    timeline.exposed_by_start[node.name] = stall
                    now[r] = link_free[r]
        elif is_wait(node):
            start = _start_of(node)
            for r, timeline in enumerate(timelines):
                if start in done_at[r]:
                    stall = max(0.0, done_at[r][start] - now[r])
                    timeline.exposed_s += stall
                    timeline.exposed_by_start[start.name] = timeline.exposed_by_start.get(start.name, 0.0) + stall
                    timeline.hidden_by[start.name] = running[r].pop(start, [])
                    now[r] += stall
        else:
            for r in range(ranks):
                now[r] += seconds[r]
                if seconds[r] > 0:
                    for names in running[r].values():
                        names.append(node.name)
    for r, timeline in enumerate(timelines):
        timeline.step_s = now[r]
    return timelines


_ROW_PASSTHROUGH = ("aten.clone", "aten.contiguous", "aten._to_copy", "aten.view", "aten.alias", "aten.detach")
_EXPERTS_OPS = (
    "trex.ep_experts_local",
    "trex.ep_experts_local_input_backward",
    "trex.ep_experts_local_weight_backward",
)


def _rows_source(node: fx.Node) -> Any:
    """The value whose rows a local-experts node computes on: its first argument, or for the weight-gradient half
    of the backward (whose first argument is the data-gradient half's output) that half's first argument."""
    value = node.args[0]
    if isinstance(value, fx.Node) and value.target is operator.getitem:
        producer = value.args[0]
        if isinstance(producer, fx.Node) and producer.op == "call_function" and _name(producer) in _EXPERTS_OPS:
            return producer.args[0]
    return value


def _exchange_upstream(value: Any) -> fx.Node | None:
    """The exchange whose received rows `value` is (through its wait and copies), or None."""
    while isinstance(value, fx.Node) and value.op == "call_function" and not is_start(value):
        if is_wait(value):
            return _start_of(value)
        if _name(value) not in _ROW_PASSTHROUGH or not value.args:
            return None
        value = value.args[0]
    return value if isinstance(value, fx.Node) and is_start(value) else None


def traffic_seconds(
    graph: fx.Graph, traffic: list[tuple[str, int, int]], cluster, groups: dict[str, list[int]] | None = None
) -> dict[fx.Node, float]:
    """The times of `graph`'s data-dependent nodes priced by the cost model with what one run really moved.

    An expert-parallel exchange's rows depend on the routing: the cost model prices it, and the local experts
    that compute on what it delivered, at balanced routing (`expected_rows`). `traffic` is one run of the graph
    as its collectives were issued (kind, bytes this rank sent, bytes it received; `runtime.emulated_link`'s
    `STATS.trace`), one entry per collective node in graph order. Each `trex.ep_exchange` is re-priced on the
    bytes it sent, each local experts node (forward and backward) on the rows its feeding exchange received.
    Same formulas (`annotate_node` with the sizes as overrides), only the sizes change. `groups`: as for
    `annotate` (process-group name -> ranks, for groups this process has not initialised)."""
    from trex.cost_model.annotate import annotate_node

    collectives = [n for n in graph.nodes if is_collective(n)]
    if len(collectives) != len(traffic):
        raise TrexError(
            f"the traffic has {len(traffic)} collectives, the graph {len(collectives)}: record one run of this graph "
            "alone (reset emulated_link.STATS before it)"
        )
    seconds: dict[fx.Node, float] = {}
    received_rows: dict[fx.Node, int] = {}
    for node, (_kind, sent, received) in zip(collectives, traffic):
        if _name(node) != "trex.ep_exchange":
            continue
        cost = annotate_node(node, cluster, groups, overrides={"bytes_in": sent, "bytes_out": sent})
        if cost is not None and cost.priced:
            seconds[node] = cost.time_s
        rows = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        if isinstance(rows, torch.Tensor):
            row_bytes = int(torch.Size(rows.shape[1:]).numel()) * rows.element_size()
            received_rows[node] = received // max(1, row_bytes)
    for node in graph.nodes:
        if node.op == "call_function" and _name(node) in _EXPERTS_OPS:
            start = _exchange_upstream(_rows_source(node))
            if start in received_rows:
                rows = received_rows[start]
                # the reads its place in the graph left out of the cache, as `annotate` found them
                cold = getattr(node.meta.get("cost"), "cold_bytes", 0.0)
                cost = annotate_node(node, cluster, groups, overrides={"S": rows, "T": rows}, cold_bytes=cold)
                if cost is not None and cost.priced:
                    seconds[node] = cost.time_s
    return seconds


# ---------------------------------------------------------------------------------------------
# the scheduler


@dataclass
class Schedule:
    order: list[fx.Node]
    moved_starts: dict[str, int]  # start -> how many nodes earlier it is issued
    hoisted: dict[str, list[str]]  # wait -> compute nodes pulled in front of it
    held_back: dict[str, str]  # start -> why it was not issued earlier
    deferred: list[str] = field(default_factory=list)  # weight-gradient nodes held back for the waits
    deferred_s: float = 0.0  # their compute time
    deferral_stopped: str = ""  # why deferring stopped before the backward's end (the memory budget), or ""


def backward_nodes(nodes: list[fx.Node], deps: dict[fx.Node, set[fx.Node]] | None = None) -> set[fx.Node]:
    """The nodes of a joint graph that depend on a tangent (its backward; empty for a forward-only graph), output
    excluded. `deps`: node -> what it must follow (default its inputs)."""
    backward: set[fx.Node] = set()
    for n in nodes:
        inputs = deps[n] if deps is not None else n.all_input_nodes
        if (n.op == "placeholder" and n.name.startswith("tangents")) or any(d in backward for d in inputs):
            backward.add(n)
    if nodes:
        backward.discard(nodes[-1])
    return backward


@dataclass
class ExposureBound:
    """The least exposed communication any schedule of a graph can reach on the timing model (`exposure_bound`)."""

    exposed_s: float
    parts: list[str]  # per segment (forward / backward): how the figure is made


def exposure_bound(graph: fx.Graph, joint: bool = True) -> ExposureBound:
    """A lower bound on the exposed communication of every schedule that keeps the collective order, on the model
    `simulate` runs (one compute stream, one serial link), per segment of a joint graph (its forward, its
    backward: each runs as its own graph and waits for its own collectives).

    The link carries the segment's transfers one after the other, and none can begin before the segment's first
    collective is issued, which needs every compute node that collective depends on; the compute that depends on
    the last collective's result runs after all transfers. So the segment lasts at least
    (compute before the first collective) + (all link time) + (compute after the last one), and exposed time is
    that minus the segment's compute. What it does not count (dependences that leave the link idle between
    layers) only makes the true least exposure larger: the pass's schedule can be compared against it.
    `joint` False: the graph is one segment (a partitioned forward or backward graph); so is a joint graph whose
    collective order interleaves forward and backward collectives (then they do not run as two segments)."""
    nodes = list(graph.nodes)
    backward = backward_nodes(nodes) if joint else set()
    in_order = [n in backward for n in nodes if is_collective(n)]
    if in_order != sorted(in_order):  # a forward collective issued after a backward one: the two segments overlap
        joint = False
    total, parts = 0.0, []
    segments = (("forward", [n for n in nodes if n not in backward]), ("backward", [n for n in nodes if n in backward]))
    for label, members in segments if joint else (("graph", nodes),):
        collectives = [n for n in members if is_collective(n)]
        if not collectives:
            continue
        member_set = set(members)
        compute = {n for n in members if n.op == "call_function" and not is_collective(n) and not is_wait(n)}
        before = _reachable(collectives[0].all_input_nodes, lambda n: n.all_input_nodes, member_set)
        # the last collective's waits (through a coalesced start's getitems), or a blocking one's users, onwards
        after = _reachable(collectives[-1].users, lambda n: n.users, member_set)
        link = sum(_seconds(n) for n in collectives)
        before_s = sum(_seconds(n) for n in before & compute)
        after_s = sum(_seconds(n) for n in after & compute)
        compute_s = sum(_seconds(n) for n in compute)
        exposed = max(0.0, before_s + link + after_s - compute_s)
        total += exposed
        parts.append(
            f"{label}: {before_s * 1e3:.3f} ms of compute before its first collective + {link * 1e3:.3f} ms on the "
            f"link + {after_s * 1e3:.3f} ms after its last - {compute_s * 1e3:.3f} ms of compute = "
            f"{exposed * 1e3:.3f} ms"
        )
    return ExposureBound(total, parts)


def _reachable(first: Iterable[fx.Node], step, within: set[fx.Node]) -> set[fx.Node]:
    """The nodes of `within` reached from `first` by repeatedly following `step` (inputs or users)."""
    found: set[fx.Node] = set()
    stack = list(first)
    while stack:
        n = stack.pop()
        if n in found or n not in within:
            continue
        found.add(n)
        stack.extend(step(n))
    return found


def weight_gradient_nodes(nodes: list[fx.Node], backward: set[fx.Node]) -> set[fx.Node]:
    """The backward's compute nodes that only the graph's output needs: the parameter gradients (weight-gradient
    GEMMs and what feeds only them, the chunks' gradient sums, the embedding's gradient). Nothing that
    communicates or that a later layer's backward reads depends on them, so they can wait to fill a transfer:
    the input / weight split of the backward (zero-bubble pipeline parallelism, Qi et al., arXiv:2401.10241;
    DeepSeek-V3's DualPipe, arXiv:2412.19437 section 3.2.1), used here to hide communication."""
    found: set[fx.Node] = set()
    for n in reversed(nodes):
        if n not in backward or n.op != "call_function" or is_collective(n) or is_wait(n) or n.is_impure():
            continue
        if n.users and all(u.op == "output" or u in found for u in n.users):
            found.add(n)
    return found


def schedule(graph: fx.Graph, budget_bytes: int, defer_weight_gradients: bool = False) -> Schedule:
    """A list schedule: issue collectives as early as inputs, collective order and budget allow; defer a
    wait while independent ready compute can fill its transfer; otherwise keep the original order.

    `defer_weight_gradients`: the backward's weight-gradient nodes (`weight_gradient_nodes`) are not placed in
    program order but held back while the memory they keep alive (their inputs) fits the budget, so that the
    data gradients reach the next collective sooner and the weight gradients fill the waits (the rest run
    before the output)."""
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    deps: dict[fx.Node, set[fx.Node]] = {n: set(_inputs(n)) for n in nodes}
    # side effects keep their relative order: each impure non-collective node follows the previous one
    previous_effect = None
    for n in nodes:
        if n.op == "call_function" and n.is_impure() and not is_wait(n):
            if previous_effect is not None:
                deps[n].add(previous_effect)
            previous_effect = n
    collectives = [n for n in nodes if is_collective(n)]
    for earlier, later in zip(collectives, collectives[1:]):
        deps[later].add(earlier)  # the issue order never changes
    kind = {
        n: "start"
        if is_start(n)
        else "wait"
        if is_wait(n)
        else "blocking"
        if is_blocking_collective(n)
        else "compute"
        if n.op == "call_function"
        else n.op
        for n in nodes
    }
    users: dict[fx.Node, list[fx.Node]] = {n: [] for n in nodes}
    for n, ds in deps.items():
        for d in ds:
            users[d].append(n)
    missing = {n: len(ds) for n, ds in deps.items()}
    # A joint graph keeps its forward before its backward (the partitioner reads it that way): nodes that
    # depend on a tangent wait until every other node is placed.
    backward = backward_nodes(nodes, deps)
    forward_left = [sum(1 for n in nodes if n not in backward and n.op != "output")]
    deferrable = weight_gradient_nodes(nodes, backward) if defer_weight_gradients else set()
    deferring: dict[fx.Node, int] = {}  # deferrable nodes the frontier passed: -> the input bytes they keep alive
    stopped = [""]
    gated: list[fx.Node] = []
    ready: list[tuple[int, fx.Node]] = []

    def release(n: fx.Node) -> None:
        if n in backward and n.op != "placeholder" and forward_left[0] > 0:
            gated.append(n)
        else:
            heapq.heappush(ready, (position[n], n))

    for n in nodes:
        if missing[n] == 0:
            release(n)

    order: list[fx.Node] = []
    scheduled: set[fx.Node] = set()
    now, link_free = 0.0, 0.0
    done_at: dict[fx.Node, float] = {}
    early: list[tuple[int, int]] = []  # (original position, bytes) of nodes placed before the frontier reached them
    held = [0]  # their bytes, while the frontier has not reached them: the extra live memory
    front_at = [0]  # the first original position not yet scheduled
    moved, hoisted, held_back = {}, {}, {}

    def frontier() -> int:
        while front_at[0] < len(nodes):
            n = nodes[front_at[0]]
            if n in scheduled or n in deferring:
                front_at[0] += 1
            elif n in deferrable and not stopped[0]:
                # held back: what it reads stays alive until it runs (counted against the budget)
                keeps = sum(_out_bytes(d) for d in _inputs(n) if d.op == "call_function")
                if held[0] + keeps > budget_bytes:
                    stopped[0] = (
                        f"stopped at {n.name}: its inputs ({keeps} B) would take the extra live memory over the "
                        f"budget of {budget_bytes} B"
                    )
                    break
                deferring[n] = keeps
                held[0] += keeps
                front_at[0] += 1
            else:
                break
        while early and early[0][0] <= front_at[0]:
            held[0] -= heapq.heappop(early)[1]
        return front_at[0]

    def extra_bytes(_front: int) -> int:
        return held[0]

    def place(n: fx.Node) -> None:
        nonlocal now, link_free
        if position[n] > frontier():
            size = _out_bytes(n)
            heapq.heappush(early, (position[n], size))
            held[0] += size
        if n in deferring:
            held[0] -= deferring.pop(n)
        scheduled.add(n)
        order.append(n)
        frontier()
        seconds = _seconds(n) if n.op == "call_function" else 0.0
        if is_start(n):
            begin = max(now, link_free)
            link_free = done_at[n] = begin + seconds
        elif is_blocking_collective(n):
            now = link_free = max(now, link_free) + seconds
        elif is_wait(n):
            start = _start_of(n)
            now = max(now, done_at.get(start, now))
        else:
            now += seconds
        if n not in backward and n.op != "output":  # (placeholders of tangents are never gated)
            forward_left[0] -= 1
            if forward_left[0] == 0:
                for g in gated:
                    heapq.heappush(ready, (position[g], g))
                gated.clear()
        for u in users[n]:
            missing[u] -= 1
            if missing[u] == 0:
                release(u)

    while ready:
        # 1. a ready start is issued at once, when the budget holds its buffer that early
        starts = [(p, n) for p, n in ready if kind[n] == "start"]
        if starts:
            _, start = min(starts, key=lambda item: item[0])
            front = frontier()
            extra = extra_bytes(front) + (_out_bytes(start) if position[start] > front else 0)
            if extra <= budget_bytes or position[start] <= front:
                ready.remove((position[start], start))
                heapq.heapify(ready)
                if position[start] > front:
                    moved[start.name] = position[start] - front
                place(start)
                continue
            held_back[start.name] = (
                f"issuing it {position[start] - front} nodes early would hold {extra} B of extra live memory, "
                f"over the budget of {budget_bytes} B"
            )
        frontier()
        # the earliest ready node, passing over held-back weight gradients while anything else is ready
        first = min(((p, n) for p, n in ready if n not in deferring), default=ready[0])[1]
        chosen = first
        if kind[first] == "wait" and done_at.get(_start_of(first), 0.0) > now:
            # the transfer is still running: fill it with independent ready compute, the earliest of the nodes
            # on the way to the next collective first, then the held-back weight gradients
            front = frontier()
            for _, n in sorted(ready, key=lambda item: (item[1] in deferring, item[0])):
                if n is first or kind[n] != "compute" or (_seconds(n) <= 0 and n not in deferring):
                    continue  # (a free held-back node, a weight's view, opens the way to its weight-gradient GEMM)
                if extra_bytes(front) + _out_bytes(n) > budget_bytes:
                    continue
                chosen = n
                hoisted.setdefault(first.name, []).append(n.name)
                break
        if ready[0][1] is chosen:
            heapq.heappop(ready)
        else:
            ready.remove((position[chosen], chosen))
            heapq.heapify(ready)
        place(chosen)
    if len(order) != len(nodes):
        raise TrexError(f"reorder_comm: scheduled {len(order)} of {len(nodes)} nodes (a dependence cycle?)")
    deferred, latest = [], -1  # weight gradients placed after a node that came later in the program
    for n in order:
        if n in deferrable and position[n] < latest:
            deferred.append(n)
        latest = max(latest, position[n])
    return Schedule(
        order,
        moved,
        hoisted,
        held_back,
        deferred=[n.name for n in deferred],
        deferred_s=sum(_seconds(n) for n in deferred),
        deferral_stopped=stopped[0],
    )


def best_schedule(graph: fx.Graph, budget_bytes: int) -> tuple[Schedule, Timeline, Decision | None]:
    """`schedule` with the backward's weight gradients in program order and held back for the waits; the one whose
    timeline exposes less communication (program order on a tie), its timeline, and the deferral's decision with
    its reason (None when the graph has no weight gradient to hold back)."""
    plain = schedule(graph, budget_bytes)
    plain_timeline = simulate(plain.order)
    deferred = schedule(graph, budget_bytes, defer_weight_gradients=True)
    if not deferred.deferred:
        return plain, plain_timeline, None
    deferred_timeline = simulate(deferred.order)
    taken = deferred_timeline.exposed_s < plain_timeline.exposed_s - 1e-12
    reason = (
        f"{len(deferred.deferred)} weight-gradient nodes ({deferred.deferred_s * 1e3:.3f} ms; only the parameter "
        "gradients need them) held back so the data gradients reach the next exchange sooner, then run under the "
        f"waits: exposed {plain_timeline.exposed_s * 1e3:.3f} ms in program order, "
        f"{deferred_timeline.exposed_s * 1e3:.3f} ms held back; "
        + ("held back" if taken else "kept in program order (holding them back hides nothing more)")
        + (f"; {deferred.deferral_stopped}" if deferred.deferral_stopped else "")
    )
    decision = Decision(
        "defer_weight_gradients" if taken else "keep_weight_gradients",
        "graph",
        reason,
        {
            "nodes": len(deferred.deferred),
            "seconds": deferred.deferred_s,
            "exposed_in_order_s": plain_timeline.exposed_s,
            "exposed_deferred_s": deferred_timeline.exposed_s,
            "deferred": deferred.deferred[:32],
        },
    )
    return (deferred, deferred_timeline, decision) if taken else (plain, plain_timeline, decision)


def apply_order(graph: fx.Graph, order: list[fx.Node]) -> bool:
    """Move the graph's nodes into `order` (a topological order of the same nodes)."""
    current = list(graph.nodes)
    if current == order:
        return False
    anchor = order[0]
    for node in order[1:]:
        anchor.append(node)
        anchor = node
    return True


# ---------------------------------------------------------------------------------------------
# bucketing


_BUCKETABLE = {
    "_c10d_functional.all_gather_into_tensor": torch.ops._c10d_functional.all_gather_into_tensor_coalesced.default,
    "_c10d_functional.all_reduce": torch.ops._c10d_functional.all_reduce_coalesced.default,
    "_c10d_functional.reduce_scatter_tensor": torch.ops._c10d_functional.reduce_scatter_tensor_coalesced.default,
}
# Reductions of gradients become ready one by one in the backward: their bucket is issued where its last
# member's input is ready (at the last member), so the earlier members wait for it.
_BUCKETED_AT_LAST = ("_c10d_functional.all_reduce", "_c10d_functional.reduce_scatter_tensor")


def _bucketable(node: fx.Node) -> str | None:
    name = _name(node)
    return name if name in _BUCKETABLE else None


# bucketings tried: (cap in units of alpha * bandwidth, None: no cap; only latency-bound messages join)
BUCKET_CAPS = ((9, True),) + tuple((cap, False) for cap in (2, 4, 9, 18, 36, 144, 576, None))


def bucket_collectives(
    gm: fx.GraphModule,
    link_alpha_s: float,
    link_bytes_per_s: float,
    cap_alpha_b: float | None = 9,
    latency_bound_only: bool = True,
) -> list[Decision]:
    """Coalesce runs of consecutive same-kind, same-group collectives. By default only latency-bound ones (each
    message below alpha * bandwidth, where the latency is at least the transfer) join, and a bucket stops at
    `9 alpha B` bytes: there the latency is a tenth of the transfer and merging more saves little while delaying
    the first result. With `latency_bound_only` False any message up to the cap (`cap_alpha_b` in units of
    alpha * B; None: no cap) joins: on a link where the transfers outlast the compute that could hide them, every
    latency saved is time saved, and a bigger bucket's later first result costs less than its latencies. The
    pass tries `BUCKET_CAPS` and keeps the one its timeline says exposes least (`_bucketing_that_pays`).

    All-gathers (parameters, ready together) are issued at the first member, when every member's input exists
    there. Gradient reductions are issued at the last member (where the last gradient is ready); a member
    joins only while the compute between the bucket's first member and it is at most the latencies the
    bucket saves (alpha per merged message): past that, waiting for the next gradient costs more time than
    one more message would."""
    if link_alpha_s <= 0 or not link_bytes_per_s or link_bytes_per_s == float("inf"):
        return []
    unit = link_alpha_s * link_bytes_per_s
    cap = math.inf if cap_alpha_b is None else cap_alpha_b * unit
    small = unit if latency_bound_only else cap
    graph = gm.graph
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    elapsed, clock = {}, 0.0  # compute seconds before each node in the original order
    for n in nodes:
        elapsed[n] = clock
        if n.op == "call_function" and not is_collective(n) and not is_wait(n):
            clock += _seconds(n)
    decisions = []
    run: list[fx.Node] = []

    def flush() -> None:
        if len(run) >= 2:
            decisions.append(_coalesce(gm, list(run), small, cap))
        run.clear()

    for node in nodes:
        if not is_collective(node):
            continue
        kind = _bucketable(node)
        waits = [u for u in node.users if is_wait(u)]
        if kind is None or len(waits) != 1 or _out_bytes(node) <= 0 or _out_bytes(node) > small:
            flush()
            continue
        if run:
            head = run[0]
            same = _bucketable(head) == kind and _group_of(head) == _group_of(node) and node.args[1:] == head.args[1:]
            if kind in _BUCKETED_AT_LAST:
                # every use of a member's result must come after the bucket (placed at this node); a member's
                # wait placed before it moves behind the bucket
                ready = all(position[u] > position[node] for m in run for w in m.users if is_wait(w) for u in w.users)
                ready = ready and elapsed[node] - elapsed[head] <= link_alpha_s * len(run)
            else:
                ready = all(position[i] < position[head] for i in _inputs(node))
            fits = sum(_out_bytes(n) for n in run) + _out_bytes(node) <= cap
            if not (same and ready and fits):
                flush()
        run.append(node)
    flush()
    return [d for d in decisions if d is not None]


def _coalesce(gm: fx.GraphModule, run: list[fx.Node], small: float, cap: float) -> Decision:
    graph = gm.graph
    kind = _name(run[0])
    at_last = kind in _BUCKETED_AT_LAST
    anchor = run[-1] if at_last else run[0]
    members = [collective_signature(n) for n in run]
    with graph.inserting_before(anchor):
        tensors = [n.args[0] for n in run]
        bucket = graph.call_function(_BUCKETABLE[kind], (tensors, *run[0].args[1:]))
        bucket.meta["val"] = [n.meta.get("val") for n in run]
        bucket.meta["reorder_comm_members"] = members
        items = []
        for i, n in enumerate(run):
            item = graph.call_function(__import__("operator").getitem, (bucket, i))
            item.meta["val"] = n.meta.get("val")
            n.replace_all_uses_with(item)
            items.append(item)
    if at_last:  # the members' waits that stood before the bucket now follow it
        last = items[-1]
        for item in items:
            for wait in [u for u in item.users if is_wait(u)]:
                last.append(wait)
                last = wait
    for n in run:
        graph.erase_node(n)
    total = sum(_out_bytes_val(v) for v in bucket.meta["val"])
    return Decision(
        "bucket",
        ", ".join(n.name for n in run),
        f"{len(run)} {kind.split('.')[-1]} of the same group (each <= {small:.0f} B) issued "
        f"as one{' where the last input is ready' if at_last else ''}: {len(run) - 1} link latencies saved; bucket "
        f"{total} B <= cap {cap:.0f} B",
        {"members": len(run), "bytes": total},
    )


def _out_bytes_val(value: Any) -> int:
    return int(value.numel()) * value.element_size() if isinstance(value, torch.Tensor) else 0


# ---------------------------------------------------------------------------------------------
# the cross-rank check


_CHECKS = 0


def check_across_ranks(sequence: list[str], graph_id: int, timeout_s: float = 60.0) -> str | None:
    """With an initialised process group: every rank publishes its sequence's digest in the group's store and
    compares it with rank 0's. Returns a description of what was checked (None without a group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    from datetime import timedelta

    from torch.distributed.distributed_c10d import _get_default_store

    digest = hashlib.sha256("\n".join(sequence).encode()).hexdigest()[:16]
    store = _get_default_store()
    rank = dist.get_rank()
    global _CHECKS
    _CHECKS += 1  # every rank compiles its graphs in the same order: the n-th check of each rank pairs up
    key = f"trex/reorder_comm/check{_CHECKS}"
    if rank == 0:
        store.set(key, digest)
        return f"rank 0 published digest {digest} of {len(sequence)} collectives"
    store.wait([key], timedelta(seconds=timeout_s))
    theirs = store.get(key).decode()
    if theirs != digest:
        raise CollectiveOrderError(
            f"rank {rank} would issue its {len(sequence)} collectives of graph {graph_id} in another order than rank 0 "
            f"(digest {digest} vs {theirs}); the ranks' graphs differ. Run with TREX_PASSES=-reorder_comm to compare"
        )
    return f"same collective order as rank 0 (digest {digest}, {len(sequence)} collectives)"


# ---------------------------------------------------------------------------------------------
# the pass


def _ensure_costs(gm: fx.GraphModule, cluster) -> None:
    if all("cost" in n.meta for n in gm.graph.nodes if n.op == "call_function"):
        return
    from trex.cost_model.annotate import annotate

    annotate(gm, cluster)


def cost_cluster(target: str):
    """The cluster collectives are priced on: the emulated link when this process emulates one (the time the
    link will really take), else the target's."""
    from trex.cost_model.annotate import cluster_of

    text = os.environ.get("TREX_EMULATE_LINK", "").strip()
    if text:
        from trex.runtime.emulated_link import parse_link

        return parse_link(text).cluster(target if target == "cpu" else "cpu")
    return cluster_of(target)


def _link_of(cluster) -> tuple[float, float]:
    tier = cluster.tiers[-1] if cluster.tiers else None
    return (tier.latency_s, tier.bandwidth(1)) if tier is not None else (0.0, float("inf"))


def _price_new_nodes(gm: fx.GraphModule, cluster) -> None:
    from trex.cost_model.annotate import annotate_node

    for n in gm.graph.nodes:
        if "cost" not in n.meta and n.op == "call_function":
            n.meta["cost"] = annotate_node(n, cluster)


def _bucketing_that_pays(gm: fx.GraphModule, alpha: float, bandwidth: float, cluster, budget: int, reference: float):
    """Bucket copies of the graph with each cap of `BUCKET_CAPS` and schedule them: the cap whose timeline exposes
    least, when that is no more than `reference` (the better of the graph as it is and its unbucketed schedule;
    a bucket issued at its last member delays its first ones, a big bucket's first result comes late), with its
    timeline and what every cap predicted; else None. Equal exposure keeps the smaller cap (less memory held); a
    cap whose largest bucket is over the memory budget is not taken (the smallest cap is always tried)."""
    from trex.graph_copy import copy_graph_module

    if not any(_bucketable(n) for n in gm.graph.nodes):
        return None
    best, tried, seen = None, {}, set()
    for cap, latency_bound_only in BUCKET_CAPS:
        name = ("no cap" if cap is None else f"{cap}*alpha*B") + (" latency-bound" if latency_bound_only else "")
        trial = copy_graph_module(gm)
        decisions = bucket_collectives(trial, alpha, bandwidth, cap, latency_bound_only)
        shape = tuple(d.subject for d in decisions)
        if not decisions or shape in seen:  # no bucket, or the same buckets as a cap tried before
            continue
        seen.add(shape)
        largest = max(d.data["bytes"] for d in decisions)
        if not latency_bound_only and largest > budget:  # a bucket's members are all live from its start
            tried[name] = f"largest bucket {largest} B over the {budget} B memory budget"
            continue
        _price_new_nodes(trial, cluster)
        _, timeline, _ = best_schedule(trial.graph, budget)
        tried[name] = timeline.exposed_s
        if timeline.exposed_s <= reference + 1e-12 and (best is None or timeline.exposed_s < best[2].exposed_s - 1e-12):
            best = (cap, latency_bound_only, timeline)
    return None if best is None else (*best, tried)


def default_budget(gm: fx.GraphModule, cluster, options: dict) -> tuple[int, str]:
    """The extra live memory the pass may add, and where the figure comes from: the budget the caller gave;
    else the plan's memory headroom (device memory minus its predicted static and activation memory) when the
    caller passes it; else the same headroom predicted from this graph: the device's usable memory minus the
    training state of the graph's parameters (parameter, gradient, two AdamW moments) and the peak of the
    values live at once in the graph's own order (its activations)."""
    if BUDGET_OPTION in options:
        return int(options[BUDGET_OPTION]), "given"
    if HEADROOM_OPTION in options:
        return max(0, int(options[HEADROOM_OPTION])), "the plan's memory headroom"
    usable = int(cluster.device.usable_memory_bytes)
    parameters = sum(_out_bytes(n) for n in _trained_inputs(gm.graph))
    static = TRAINING_STATE_PER_PARAMETER * parameters
    peak = _peak_live_bytes(gm.graph)
    headroom = max(0, usable - static - peak)
    return headroom, (
        f"device memory headroom: {usable / 2**30:.2f} GiB usable - {static / 2**30:.3f} GiB training state - "
        f"{peak / 2**30:.3f} GiB peak live values of the graph"
    )


def _trained_inputs(graph: fx.Graph) -> list[fx.Node]:
    """The inputs of a joint graph that get a gradient: AOTAutograd's joint graph returns the forward's outputs
    and then one gradient per `primals` input (None where there is none)."""
    primals = [n for n in graph.nodes if n.op == "placeholder" and n.name.startswith("primals")]
    if not any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes):
        return []
    output = next((n for n in graph.nodes if n.op == "output"), None)
    values = output.args[0] if output is not None and output.args else ()
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    if len(values) < len(primals):
        return []
    grads = values[len(values) - len(primals) :]
    return [p for p, g in zip(primals, grads) if isinstance(g, fx.Node)]


def _peak_live_bytes(graph: fx.Graph) -> int:
    """The most bytes of node values alive at once when the graph runs in its order (a value lives from its node
    to its last user; graph inputs are counted as static memory, not here)."""
    nodes = list(graph.nodes)
    last_use = {}
    for i, n in enumerate(nodes):
        for d in n.all_input_nodes:
            last_use[d] = i
    live, peak = 0, 0
    freed_at: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.op == "call_function":
            size = _out_bytes(n)
            live += size
            freed_at[last_use.get(n, i)] = freed_at.get(last_use.get(n, i), 0) + size
        peak = max(peak, live)
        live -= freed_at.pop(i, 0)
    return peak


class ReorderComm:
    """Invariant established: every collective is issued as early and waited for as late as the cost model,
    the dependences and the memory budget allow, with compute between start and wait that hides it; the
    order in which collectives are issued is unchanged (identical on every rank). See the module docstring."""

    name: ClassVar[str] = "reorder_comm"

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        graph = gm.graph
        if not any(is_collective(n) for n in graph.nodes):
            return PassResult(modified=False)
        cluster = cost_cluster(ctx.target)
        _ensure_costs(gm, cluster)
        budget, budget_source = default_budget(gm, cluster, ctx.options)
        before_sequence = collective_sequence(graph)
        before = simulate(graph.nodes)
        decisions: list[Decision] = []

        alpha, bandwidth = _link_of(cluster)
        plan, after, deferral = best_schedule(graph, budget)
        if ctx.fuel.take():
            bucketed = _bucketing_that_pays(
                gm, alpha, bandwidth, cluster, budget, min(after.exposed_s, before.exposed_s)
            )
            if bucketed is not None:
                cap, latency_bound_only, _, tried = bucketed
                # the same rewrite as on the trial copy
                decisions += bucket_collectives(gm, alpha, bandwidth, cap, latency_bound_only)
                decisions.append(
                    Decision(
                        "bucket_cap",
                        "graph",
                        f"bucket cap {'none' if cap is None else f'{cap} * alpha * B'}"
                        f"{', latency-bound messages only' if latency_bound_only else ''}: the least exposed "
                        "communication on the timeline of the bucketings tried ("
                        + ", ".join(
                            f"{name} {seconds * 1e3:.3f} ms" if isinstance(seconds, float) else f"{name}: {seconds}"
                            for name, seconds in tried.items()
                        )
                        + ")",
                        {"cap_alpha_b": cap, "latency_bound_only": latency_bound_only, "exposed_by_cap_s": tried},
                    )
                )
                _price_new_nodes(gm, cluster)
                plan, after, deferral = best_schedule(graph, budget)
        modified = bool(decisions)
        if after.exposed_s <= before.exposed_s + 1e-12 and ctx.fuel.take():
            modified = apply_order(graph, plan.order) or modified
        else:
            after = simulate(graph.nodes)
            decisions.append(
                Decision(
                    "keep_order",
                    "graph",
                    "the rescheduled graph would not expose less communication on the model "
                    f"({after.exposed_s * 1e3:.3f} ms before)",
                )
            )
        check_same_order(before_sequence, collective_sequence(graph))
        if deferral is not None:
            decisions.append(deferral)
        decisions += self._collective_decisions(graph, before, after, plan)
        decisions += ep_micro_chunk_decisions(graph, alpha)
        bound = exposure_bound(graph)
        across = check_across_ranks(collective_sequence(graph), ctx.graph_id)
        decisions.append(
            Decision(
                "summary",
                "graph",
                f"predicted exposed communication {before.exposed_s * 1e3:.3f} -> {after.exposed_s * 1e3:.3f} ms of "
                f"{before.comm_s * 1e3:.3f} ms on the link; step {before.step_s * 1e3:.3f} -> {after.step_s * 1e3:.3f} "
                f"ms; no schedule keeping the collective order exposes less than {bound.exposed_s * 1e3:.3f} ms on the "
                f"model ({'; '.join(bound.parts)}); collective order unchanged ({len(before_sequence)} collectives); "
                "extra live memory budget "
                f"{budget / 2**20:.1f} MiB ({budget_source})" + (f"; {across}" if across else ""),
                {
                    "exposed_before_s": before.exposed_s,
                    "exposed_after_s": after.exposed_s,
                    "exposed_bound_s": bound.exposed_s,
                    "comm_s": before.comm_s,
                    "step_before_s": before.step_s,
                    "step_after_s": after.step_s,
                    "budget_bytes": budget,
                    "budget_source": budget_source,
                },
            )
        )
        gm.meta["reorder_comm"] = {
            "exposed_before_s": before.exposed_s,
            "exposed_after_s": after.exposed_s,
            "exposed_bound_s": bound.exposed_s,
            "comm_s": before.comm_s,
            "step_before_s": before.step_s,
            "step_after_s": after.step_s,
        }
        return PassResult(modified=modified, decisions=decisions)

    @staticmethod
    def _collective_decisions(graph: fx.Graph, before: Timeline, after: Timeline, plan: Schedule) -> list[Decision]:
        out = []
        for node in graph.nodes:
            if not is_collective(node):
                continue
            hidden = after.hidden_by.get(node.name, [])
            hidden_s = sum(_seconds(n) for n in graph.nodes if n.name in set(hidden))
            moved = plan.moved_starts.get(node.name, 0)
            reason = (
                f"{_seconds(node) * 1e3:.3f} ms on the link; exposed {before.exposed_by_start.get(node.name, 0) * 1e3:.3f}"
                f" -> {after.exposed_by_start.get(node.name, 0) * 1e3:.3f} ms; "
                + (f"issued {moved} nodes earlier; " if moved else "issued where its inputs are ready; ")
                + (
                    f"hidden under {len(hidden)} compute nodes ({hidden_s * 1e3:.3f} ms: {', '.join(hidden[:4])}"
                    + (", ..." if len(hidden) > 4 else "")
                    + ")"
                    if hidden
                    else "nothing independent to hide it"
                )
                + (f"; held back: {plan.held_back[node.name]}" if node.name in plan.held_back else "")
            )
            out.append(
                Decision(
                    "schedule",
                    node.name,
                    reason,
                    {
                        "op": _name(node),
                        "link_s": _seconds(node),
                        "exposed_before_s": before.exposed_by_start.get(node.name, 0.0),
                        "exposed_after_s": after.exposed_by_start.get(node.name, 0.0),
                        "moved_earlier_by": moved,
                        "hidden_by": hidden[:16],
                    },
                )
            )
        return out


# ---------------------------------------------------------------------------------------------
# expert parallelism: would two micro-chunks pay?


def ep_micro_chunk_decisions(graph: fx.Graph, alpha_s: float) -> list[Decision]:
    """For each expert-parallel layer (dispatch exchanges, local experts, combine exchanges; one set per
    micro-chunk, the chunks of a layer share its expert weights): the chunk count the cost model
    (`cost_model.ep_chunks.choose_chunks`) picks for the layer's summed times, against the count it runs in.

    The split itself is made before capture, where the tokens are cut (`runtime.expert_parallel.plan_ep_chunks`
    prices the layer with the same cost model and formula); a chunked layer's graph holds one dispatch / experts
    / combine set per chunk, in pipeline order, and this pass then schedules their starts and waits."""
    from trex.cost_model.ep_chunks import choose_chunks

    layers: dict[Any, list[fx.Node]] = {}
    for node in graph.nodes:
        if node.op == "call_function" and _name(node) == "trex.ep_experts_local":
            layers.setdefault(node.args[2], []).append(node)
    decisions = []
    for experts_nodes in layers.values():
        exchanges = [(_exchange_feeding(n), _exchange_after(n)) for n in experts_nodes]
        if any(d is None or b is None for d, b in exchanges):
            continue
        n = len(experts_nodes)
        alpha = min([alpha_s] + [_seconds(x) for pair in exchanges for x in pair])
        # the one-chunk equivalents: n chunk messages carry n latencies, one chunk carries one
        d = sum(_seconds(x) for x, _ in exchanges) - (n - 1) * alpha
        b = sum(_seconds(x) for _, x in exchanges) - (n - 1) * alpha
        c = sum(_seconds(x) for x in experts_nodes)
        choice = choose_chunks(d, c, b, alpha)
        if n > 1:
            action, verdict = (
                "ep_chunks_applied",
                f"the layer runs in {n} chunks (cost model's choice: {choice.chunks})",
            )
        elif choice.chunks > 1:
            action = "ep_split_pays"
            verdict = (
                f"runs as one chunk; {choice.chunks} would pay: runtime.expert_parallel.plan_ep_chunks(model, tokens) "
                "applies the split before capture"
            )
        else:
            action, verdict = "ep_one_chunk", "kept as one chunk"
        decisions.append(
            Decision(
                action,
                experts_nodes[0].name,
                f"{verdict}: {choice.reason}",
                {
                    "chunks": n,
                    "chosen": choice.chunks,
                    "dispatch_s": d,
                    "experts_s": c,
                    "combine_s": b,
                    "seconds_by_chunks": choice.seconds,
                },
            )
        )
    return decisions


def _exchange_feeding(experts: fx.Node) -> fx.Node | None:
    received = experts.args[0] if experts.args else None
    if isinstance(received, fx.Node) and is_wait(received):
        return _start_of(received)
    return None


def _exchange_after(experts: fx.Node) -> fx.Node | None:
    for user in experts.users:  # getitem(out, 0) -> ep_exchange
        for consumer in user.users:
            if is_start(consumer):
                return consumer
    return None
