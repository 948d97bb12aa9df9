"""Pipeline stage partitioning of a non-uniform layer stack: optimal, or optimal within a proved gap.

The stack (layers 0..L-1) is cut into C = pp * vpp contiguous chunks; chunk c runs on pipeline
device c mod pp (Megatron's interleaving), chunk 0 also carries the embedding and chunk C-1 the
output head and the MTP modules. Middle chunks hold at least one layer; the end chunks may hold none
(an embedding-only or head-only chunk, as in Megatron's `Et|...|mL` layouts). The split minimises
the slowest device's time per micro-batch,

    max_d  sum_{c mod pp = d}  chunk_time(c),

which sets the steady-state rate of (interleaved) 1F1B: the closed-form makespan
m * max_d t_d + (pp - 1)/vpp * mean_d t_d has a mean no split changes. Every device must also fit
its memory (`MemoryBudget`). A chunk's time is the cost model's (`SplitProblem.chunk_time`; it may
group layers, e.g. host-bound stretches) and must grow when a layer is added; `layer_times` are
additive per-layer times that never exceed it and serve as lower bounds.

Solvers:

* vpp = 1 - exact. Bisection on the answer T with a greedy feasibility test: each device in turn
  takes the longest run of layers whose time stays <= T and whose memory fits, keeping one layer
  for every middle device after it. Greedy-longest is optimal for contiguous min-max partitions
  whose chunk costs grow with every layer added (exchange argument: ending a prefix later never
  makes the rest harder). Bisection stops at a 1e-12 relative bracket.
* vpp > 1 - a device's chunks are spread over the stack, so the greedy argument fails and every
  device is coupled to every other. Incumbents: Megatron's even split, a cut of the cumulative-time
  curve, integer water-filling of layer counts (optimal for uniform stacks), each improved by a
  local search. Proofs, cheapest first: the bound max(total / pp, each device's extras plus its
  mandatory layers); a relaxation that keeps only how many layers of each time every device holds
  (`counts_feasible`, exact DP for up to two distinct layer times: it proves DeepSeek-V4's CSA/HCA
  and V3's dense/MoE splits optimal where integrality keeps total / pp out of reach); then a
  depth-first branch and bound over chunk sizes in stack order, pruned by the incumbent, by the
  work left against the room left on devices still receiving chunks, by memory lower bounds and
  by a dominance memo. It stops after `node_budget` nodes; the split then records that it was not
  proved optimal and its certified gap.

Every solver is checked against brute-force enumeration of all splits on small stacks (tests/planner).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from trex.errors import TrexError

_REL = 1e-12  # a split must beat the incumbent by more than this (relative) to replace it
NODE_BUDGET = 20_000  # interleaved branch-and-bound nodes before settling for the incumbent and its gap


class MemoryBudget(Protocol):
    """Memory of one pipeline device given the layer ranges of its chunks (its j-th chunk first)."""

    def fits(self, device: int, ranges: Sequence[tuple[int, int]]) -> bool:
        """Exact: does the device holding these (start, end) chunk ranges fit?"""
        ...

    def lower_bound_fits(self, device: int, ranges: Sequence[tuple[int, int]]) -> bool:
        """False only if no extension of these ranges (more layers, more chunks) can fit."""
        ...

    def signature(self, device: int, ranges: Sequence[tuple[int, int]]) -> object:
        """Hashable; equal signatures mean equal memory for every extension (e.g. kind counts per chunk)."""
        ...

    def excess(self, device: int, ranges: Sequence[tuple[int, int]]) -> float:
        """Bytes over the device's capacity (<= 0: it fits); guides the search towards splits that fit."""
        ...


@dataclass(frozen=True)
class StageSplit:
    layers_per_chunk: tuple[int, ...]
    device_times: tuple[float, ...]  # per micro-batch, all chunks of each device
    optimal: bool = True  # proved optimal (False: the interleaved search ran out of nodes)
    lower_bound: float = 0.0  # no split has a smaller bottleneck
    method: str = ""  # which solver or proof settled it

    @property
    def bottleneck(self) -> float:
        return max(self.device_times)

    @property
    def gap(self) -> float:
        """Relative distance to the proved lower bound (0 when optimal)."""
        if self.optimal:
            return 0.0
        return max(0.0, self.bottleneck / self.lower_bound - 1.0) if self.lower_bound > 0 else math.inf


@dataclass(frozen=True)
class SplitProblem:
    layer_times: tuple[float, ...]  # additive per-layer time (a lower bound of any chunk's time)
    pp: int
    vpp: int
    first_extra: float = 0.0  # embedding (chunk 0)
    last_extra: float = 0.0  # head + MTP (last chunk)
    chunk_time: Callable[[int, int, int], float] | None = None  # (start, end, chunk) -> time, extras included

    @property
    def chunks(self) -> int:
        return self.pp * self.vpp

    @property
    def num_layers(self) -> int:
        return len(self.layer_times)

    def min_layers(self, chunk: int) -> int:
        return 0 if chunk in (0, self.chunks - 1) else 1

    def extra(self, chunk: int) -> float:
        return (self.first_extra if chunk == 0 else 0.0) + (self.last_extra if chunk == self.chunks - 1 else 0.0)

    def check(self) -> None:
        if self.pp < 1 or self.vpp < 1:
            raise TrexError(f"pp={self.pp}, vpp={self.vpp}: both must be positive")
        needed = max(0, self.chunks - 2)
        if self.num_layers < needed:
            raise TrexError(
                f"pp*vpp = {self.chunks} chunks need at least {needed} layers (one per middle chunk); the stack has {self.num_layers}"
            )


class _Costs:
    """Chunk times of one problem: the exact (possibly grouped) time and the additive bound."""

    def __init__(self, problem: SplitProblem):
        self.problem = problem
        self.prefix = [0.0]
        for t in problem.layer_times:
            self.prefix.append(self.prefix[-1] + t)
        self._exact: dict[tuple[int, int, int], float] = {}  # the local search asks the same chunks again and again

    def additive(self, start: int, end: int, chunk: int) -> float:
        return self.prefix[end] - self.prefix[start] + self.problem.extra(chunk)

    def exact(self, start: int, end: int, chunk: int) -> float:
        if self.problem.chunk_time is None:
            return self.additive(start, end, chunk)
        key = (start, end, chunk)
        value = self._exact.get(key)
        if value is None:
            value = self._exact[key] = self.problem.chunk_time(start, end, chunk)
        return value

    def device_times(self, layers_per_chunk: Sequence[int]) -> tuple[float, ...]:
        times = [0.0] * self.problem.pp
        start = 0
        for c, n in enumerate(layers_per_chunk):
            times[c % self.problem.pp] += self.exact(start, start + n, c)
            start += n
        return tuple(times)


def device_times(problem: SplitProblem, layers_per_chunk: Sequence[int]) -> tuple[float, ...]:
    return _Costs(problem).device_times(layers_per_chunk)


def chunk_ranges(layers_per_chunk: Sequence[int], pp: int) -> list[list[tuple[int, int]]]:
    """Per device, the (start, end) layer range of each of its chunks, in local order."""
    ranges: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    start = 0
    for c, n in enumerate(layers_per_chunk):
        ranges[c % pp].append((start, start + n))
        start += n
    return ranges


def fits_memory(memory: MemoryBudget | None, layers_per_chunk: Sequence[int], pp: int) -> bool:
    if memory is None:
        return True
    return all(memory.fits(d, r) for d, r in enumerate(chunk_ranges(layers_per_chunk, pp)))


def split_stages(
    problem: SplitProblem,
    memory: MemoryBudget | None = None,
    *,
    node_budget: int = NODE_BUDGET,
    start: Sequence[int] | None = None,
    thorough: bool = True,
) -> StageSplit | None:
    """The split with the smallest slowest-device time that fits memory; None if no split fits.

    Interleaved (vpp > 1) only: `start` is a split to begin the local search from (e.g. the
    time-optimal split when re-solving under a memory limit) instead of the three standard
    incumbents; `thorough=False` improves only the best of those three (a search pricing many layouts).
    """
    problem.check()
    costs = _Costs(problem)
    if problem.chunks == 1:
        split = (problem.num_layers,)
        if not fits_memory(memory, split, 1):
            return None
        times = costs.device_times(split)
        return StageSplit(split, times, True, max(times), "single stage")
    if problem.vpp == 1:
        return _split_contiguous(costs, memory)
    return _split_interleaved(costs, memory, node_budget, tuple(start) if start is not None else None, thorough)


# -- vpp = 1: bisection + greedy ------------------------------------------------------------------


def _longest(costs: _Costs, start: int, lo_end: int, hi_end: int, chunk: int, limit: float) -> int:
    """Largest end in [lo_end, hi_end] with chunk time <= limit (chunk times grow with end); lo_end - 1 if none."""
    if lo_end > hi_end or costs.exact(start, lo_end, chunk) > limit:
        return lo_end - 1
    lo, hi = lo_end, hi_end
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if costs.exact(start, mid, chunk) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _longest_fitting(memory: MemoryBudget, device: int, start: int, lo_end: int, hi_end: int) -> int:
    """Largest end in [lo_end, hi_end] whose range fits memory (memory grows with end); lo_end - 1 if none."""
    if lo_end > hi_end or not memory.fits(device, [(start, lo_end)]):
        return lo_end - 1
    lo, hi = lo_end, hi_end
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if memory.fits(device, [(start, mid)]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _greedy(costs: _Costs, limit: float, memory: MemoryBudget | None) -> list[int] | None:
    problem = costs.problem
    pp, n_layers = problem.pp, problem.num_layers
    counts: list[int] = []
    start = 0
    for d in range(pp):
        if d == pp - 1:
            if costs.exact(start, n_layers, d) > limit or (
                memory is not None and not memory.fits(d, [(start, n_layers)])
            ):
                return None
            counts.append(n_layers - start)
            return counts
        reserve = max(0, pp - d - 2)  # middle devices after this one need a layer each
        lo_end = start + problem.min_layers(d)
        end = _longest(costs, start, lo_end, n_layers - reserve, d, limit)
        if memory is not None and end >= lo_end and not memory.fits(d, [(start, end)]):
            end = _longest_fitting(memory, d, start, lo_end, end - 1)
        if end < lo_end:
            return None
        counts.append(end - start)
        start = end
    return None


def _split_contiguous(costs: _Costs, memory: MemoryBudget | None) -> StageSplit | None:
    problem = costs.problem
    best = _greedy(costs, math.inf, memory)
    if best is None:
        return None
    hi = max(costs.device_times(best))
    lo = _forced_lower_bound(problem)
    while hi - lo > _REL * hi:
        mid = (lo + hi) / 2
        split = _greedy(costs, mid, memory)
        if split is None:
            lo = mid
        else:
            best, hi = split, max(costs.device_times(split))
    times = costs.device_times(best)
    return StageSplit(tuple(best), times, True, max(times), "bisection + greedy")


# -- incumbents for vpp > 1 -----------------------------------------------------------------------


def even_split(num_layers: int, chunks: int) -> tuple[int, ...]:
    """Megatron's default: as even as possible, the shorter chunks at the ends (cost_model.pipeline)."""
    from trex.cost_model.pipeline import default_layers_per_chunk

    return default_layers_per_chunk(num_layers, chunks)


def _balanced_cut(costs: _Costs) -> tuple[int, ...]:
    """Cut the cumulative additive time (extras included) at multiples of total / chunks."""
    problem, prefix = costs.problem, costs.prefix
    chunks, n_layers = problem.chunks, problem.num_layers
    total = prefix[-1] + problem.first_extra + problem.last_extra
    bounds = [0]
    need = [0] * (chunks + 1)  # middle chunks from c on need a layer each
    for c in range(chunks - 1, -1, -1):
        need[c] = need[c + 1] + problem.min_layers(c)
    for c in range(1, chunks):
        target = c * total / chunks - problem.first_extra
        e = bisect.bisect_left(prefix, target)
        if e > 0 and (e > n_layers or abs(prefix[e - 1] - target) <= abs(prefix[e] - target)):
            e -= 1
        lo = bounds[-1] + problem.min_layers(c - 1)
        hi = n_layers - need[c]
        bounds.append(min(max(e, lo), hi))
    bounds.append(n_layers)
    return tuple(bounds[i + 1] - bounds[i] for i in range(chunks))


def _water_filling(problem: SplitProblem) -> tuple[int, ...]:
    """Layer counts per device by water-filling on the mean layer time (optimal when all layers cost
    the same), spread over each device's chunks; leftovers go to its later chunks (fewer micro-batches
    in flight there)."""
    pp, chunks = problem.pp, problem.chunks
    t = sum(problem.layer_times) / problem.num_layers if problem.num_layers else 0.0
    own = [[c for c in range(chunks) if c % pp == d] for d in range(pp)]
    extra = [sum(problem.extra(c) for c in own[d]) for d in range(pp)]
    counts = [sum(problem.min_layers(c) for c in own[d]) for d in range(pp)]
    heap = [((counts[d] + 1) * t + extra[d], d) for d in range(pp)]
    heapq.heapify(heap)
    for _ in range(problem.num_layers - sum(counts)):
        _, d = heapq.heappop(heap)
        counts[d] += 1
        heapq.heappush(heap, ((counts[d] + 1) * t + extra[d], d))
    sizes = [0] * chunks
    for d in range(pp):
        base = [problem.min_layers(c) for c in own[d]]
        per, rest = divmod(counts[d] - sum(base), len(own[d]))
        for j, c in enumerate(own[d]):
            sizes[c] = base[j] + per + (1 if j >= len(own[d]) - rest else 0)
    return tuple(sizes)


def _improve(costs: _Costs, split: tuple[int, ...], memory: MemoryBudget | None) -> tuple[int, ...]:
    """Local search: move one chunk boundary by one layer while that lowers (memory excess, bottleneck,
    spread) - a split that does not fit is first walked towards one that does."""
    problem = costs.problem
    pp, chunks = problem.pp, problem.chunks
    mins = [problem.min_layers(c) for c in range(chunks)]
    sizes = list(split)
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    chunk_t = [costs.exact(starts[c], starts[c + 1], c) for c in range(chunks)]
    times = [0.0] * pp
    for c, t in enumerate(chunk_t):
        times[c % pp] += t

    seen: dict[tuple, float] = {}  # a pass re-tries most moves of the pass before: remember what they cost

    def over(device: int, bounds: Sequence[int]) -> float:
        if memory is None:
            return 0.0
        ranges = tuple((bounds[c], bounds[c + 1]) for c in range(device, chunks, pp))
        key = (device, ranges)
        if key not in seen:
            seen[key] = max(0.0, memory.excess(device, ranges))
        return seen[key]

    excess = [over(d, starts) for d in range(pp)]

    def score(values: Sequence[float], spill: Sequence[float]) -> tuple[float, float, float]:
        return sum(spill), max(values), sum(v * v for v in values)

    current = score(times, excess)
    improved = True
    while improved:
        improved = False
        for b in range(1, chunks):
            for step in (1, -1):
                left, right = sizes[b - 1] + step, sizes[b] - step
                if left < mins[b - 1] or right < mins[b]:
                    continue
                cut = starts[b] + step
                t_left, t_right = costs.exact(starts[b - 1], cut, b - 1), costs.exact(cut, starts[b + 1], b)
                trial = list(times)
                trial[(b - 1) % pp] += t_left - chunk_t[b - 1]
                trial[b % pp] += t_right - chunk_t[b]
                if current[0] == 0.0 and (max(trial), sum(v * v for v in trial)) >= current[1:]:
                    continue  # the split fits already: a move that does not improve the times cannot win, whatever its memory
                spill = excess
                if memory is not None:
                    bounds = list(starts)
                    bounds[b] = cut
                    spill = list(excess)
                    grows, shrinks = ((b - 1) % pp, b % pp) if step > 0 else (b % pp, (b - 1) % pp)
                    spill[grows] = over(grows, bounds)
                    if shrinks != grows and excess[shrinks] > 0.0:  # a device that fits still fits with a layer less
                        spill[shrinks] = over(shrinks, bounds)
                trial_score = score(trial, spill)
                if trial_score >= current:
                    continue
                sizes = sizes[: b - 1] + [left, right] + sizes[b + 1 :]
                times, excess, current, improved = trial, spill, trial_score, True
                starts[b] = cut
                chunk_t[b - 1], chunk_t[b] = t_left, t_right
    return tuple(sizes)


# -- lower bounds ---------------------------------------------------------------------------------


def _device_extras(problem: SplitProblem) -> list[tuple[float, int]]:
    """Per device: (extras it carries, layers its middle chunks must hold)."""
    out = []
    for d in range(problem.pp):
        own = [c for c in range(problem.chunks) if c % problem.pp == d]
        out.append((sum(problem.extra(c) for c in own), sum(problem.min_layers(c) for c in own)))
    return out


def _forced_lower_bound(problem: SplitProblem) -> float:
    """max(total / pp, each device's extras plus its mandatory layers at the cheapest layer time)."""
    total = sum(problem.layer_times) + problem.first_extra + problem.last_extra
    cheapest = min(problem.layer_times, default=0.0)
    return max([total / problem.pp] + [extra + cheapest * need for extra, need in _device_extras(problem)])


def _time_classes(times: Sequence[float]) -> list[tuple[float, int]]:
    classes: list[tuple[float, int]] = []
    for t in sorted(times):
        if classes and t - classes[-1][0] <= 1e-12 * max(t, 1e-300):
            classes[-1] = (classes[-1][0], classes[-1][1] + 1)
        else:
            classes.append((t, 1))
    return classes


def counts_feasible(problem: SplitProblem, limit: float) -> bool:
    """Can the layers be shared out with every device <= `limit` if only counts mattered?

    A relaxation of the split: positions are dropped, each device only holds some number of layers
    of each (additive) time. False proves that no split reaches `limit`. Decided exactly for up to
    two distinct layer times (every model here: V3 dense vs MoE, V4 CSA vs HCA) by a DP over
    devices whose state is the number of faster layers placed and whose value is the most slower
    layers placed; with more distinct times it answers True (no proof).
    """
    classes = _time_classes(problem.layer_times)
    if len(classes) > 2:
        return True
    devices = [(limit - extra, need) for extra, need in _device_extras(problem)]
    if not classes:
        return all(cap >= -1e-12 * max(1.0, abs(limit)) and need == 0 for cap, need in devices)
    if len(classes) == 1:
        t, n = classes[0]
        room = 0
        for cap, need in devices:
            k = n if t <= 0 else math.floor(cap / t * (1 + 1e-12))
            if k < need:
                return False
            room += k
        return room >= n
    (ta, na), (tb, nb) = classes
    most_b = {0: 0}  # faster layers placed -> most slower layers placed
    for cap, need in devices:
        nxt: dict[int, int] = {}
        for a, b in most_b.items():
            for xa in range(0, na - a + 1):
                left = cap - xa * ta
                if left < -1e-12 * max(1.0, abs(cap)):
                    break
                xb = min(nb - b, math.floor(max(0.0, left) / tb * (1 + 1e-12)))
                if xa + xb < need:
                    continue
                if nxt.get(a + xa, -1) < b + xb:
                    nxt[a + xa] = b + xb
        most_b = nxt
        if not most_b:
            return False
    return most_b.get(na, -1) >= nb


def _counts_lower_bound(problem: SplitProblem, lo: float, hi: float) -> float:
    """The largest limit the count relaxation refutes, by bisection between a bound and a split."""
    if counts_feasible(problem, lo):
        return lo
    for _ in range(40):
        mid = (lo + hi) / 2
        if counts_feasible(problem, mid):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * hi:
            break
    return lo


# -- vpp > 1 ------------------------------------------------------------------------------------


class _OutOfNodes(Exception):
    """The branch and bound spent its node budget: the incumbent stands, with its certified gap."""


def _split_interleaved(
    costs: _Costs,
    memory: MemoryBudget | None,
    node_budget: int,
    start: tuple[int, ...] | None = None,
    thorough: bool = True,
) -> StageSplit | None:
    """Incumbents and proofs first; the branch and bound only when `node_budget` > 0."""
    problem = costs.problem
    pp, chunks, n_layers = problem.pp, problem.chunks, problem.num_layers
    prefix = costs.prefix
    lower = _forced_lower_bound(problem)

    incumbent: tuple[int, ...] | None = None
    best = math.inf
    starts = (
        [start]
        if start is not None
        else sorted({even_split(n_layers, chunks), _balanced_cut(costs), _water_filling(problem)})
    )
    starts = [s for s in starts if all(n >= problem.min_layers(c) for c, n in enumerate(s))]
    if not thorough and starts:  # the local search runs from the best start only
        starts = [min(starts, key=lambda s: max(costs.device_times(s)))]
    for split in starts:
        split = _improve(costs, split, memory)
        if fits_memory(memory, split, pp) and max(costs.device_times(split)) < best:
            best, incumbent = max(costs.device_times(split)), split
    if incumbent is not None:
        if best - lower <= _REL * best:
            return StageSplit(incumbent, costs.device_times(incumbent), True, best, "incumbent meets total/pp bound")
        if not counts_feasible(problem, best * (1 - _REL)):
            return StageSplit(
                incumbent, costs.device_times(incumbent), True, best, "incumbent proved by count relaxation"
            )

    # Branch and bound over chunk sizes, in stack order.
    need = [0] * (chunks + 1)  # chunks c.. need at least this many layers
    for c in range(chunks - 1, -1, -1):
        need[c] = need[c + 1] + problem.min_layers(c)
    later = [frozenset(x % pp for x in range(c + 1, chunks)) for c in range(chunks)]  # devices with chunks after c
    mean_layer = prefix[-1] / n_layers if n_layers else 0.0
    exhausted: dict[tuple, list[tuple[float, ...]]] = {}
    loads = [0.0] * pp
    ranges: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    sizes: list[int] = []
    state: dict = {"best": best, "split": incumbent, "nodes": 0}

    def dominated(key: tuple, vector: tuple[float, ...]) -> bool:
        return any(
            all(s <= v + 1e-12 * max(1.0, abs(v)) for s, v in zip(seen, vector)) for seen in exhausted.get(key, ())
        )

    def visit(c: int, start: int) -> None:
        state["nodes"] += 1
        if state["nodes"] > node_budget:
            raise _OutOfNodes
        d = c % pp
        threshold = state["best"] * (1 - _REL)
        active = tuple(sorted(later[c - 1])) if c > 0 else tuple(range(pp))
        finished = max((loads[x] for x in range(pp) if x not in active), default=0.0)
        if finished >= threshold:
            return  # a device that gets no more chunks is already as slow as the incumbent
        if c == chunks - 1:
            if n_layers - start < problem.min_layers(c):
                return
            load = loads[d] + costs.exact(start, n_layers, c)
            if load >= threshold:
                return
            ranges[d].append((start, n_layers))
            ok = memory is None or memory.fits(d, ranges[d])
            ranges[d].pop()
            if ok:
                state["best"] = max(max((loads[x] for x in range(pp) if x != d), default=0.0), load)
                state["split"] = (*sizes, n_layers - start)
            return
        signature = tuple(memory.signature(x, ranges[x]) for x in active) if memory is not None else None
        key = (c, start, signature)
        vector = (finished, *(loads[x] for x in active))
        if dominated(key, vector):
            return
        lo, hi = problem.min_layers(c), n_layers - start - need[c + 1]
        continuing = later[c]
        # sizes nearest an even share of what is left first, so good completions come early
        share = (prefix[n_layers] - prefix[start] + problem.last_extra) / (chunks - c) - problem.extra(c)
        ideal = round(share / mean_layer) if mean_layer else lo
        for n in sorted(range(lo, hi + 1), key=lambda k: (abs(k - ideal), k)):
            end = start + n
            threshold = state["best"] * (1 - _REL)
            load = loads[d] + costs.exact(start, end, c)
            if load >= threshold:
                continue
            # the rest needs at least its additive time; only devices still receiving chunks have room
            room = sum(threshold - (load if x == d else loads[x]) for x in continuing)
            if prefix[n_layers] - prefix[end] + problem.last_extra > room:
                continue
            ranges[d].append((start, end))
            if memory is not None and not (
                memory.lower_bound_fits(d, ranges[d]) if d in continuing else memory.fits(d, ranges[d])
            ):
                ranges[d].pop()
                continue
            saved = loads[d]
            loads[d] = load
            sizes.append(n)
            try:
                visit(c + 1, end)
            finally:
                sizes.pop()
                loads[d] = saved
                ranges[d].pop()
        # every completion below the current incumbent has now been tried from this state
        exhausted.setdefault(key, []).append(vector)

    optimal = True
    try:
        visit(0, 0)
    except _OutOfNodes:
        optimal = False
    if state["split"] is None:
        return None
    split = state["split"]
    times = costs.device_times(split)
    if optimal:
        return StageSplit(tuple(split), times, True, max(times), "branch and bound")
    if state["nodes"] > 1 and not counts_feasible(problem, max(times) * (1 - _REL)):
        return StageSplit(tuple(split), times, True, max(times), "count relaxation")
    if node_budget > 0:  # worth a tighter bound: the caller spent a search on it
        lower = _counts_lower_bound(problem, lower, max(times))
    return StageSplit(tuple(split), times, False, lower, f"best of {node_budget} branch-and-bound nodes")
