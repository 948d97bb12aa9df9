"""Alpha-beta costs of collectives over a group's placement on a cluster.

On one tier with f participants, per-device bandwidth B and per-step latency a (Thakur, Rabenseifner
& Gropp 2005; the algorithms NCCL and HCCL implement):

    all_gather(n), reduce_scatter(n)  ring:  (f-1) a + (f-1)/f * n / B        (n = the full buffer)
    all_reduce(n)                     ring:  2(f-1) a + 2(f-1)/f * n / B
                                      tree:  2 ceil(log2 f) a + 2 n / B     (latency-bound sizes)
    all_to_all(n)                            a + (f-1)/f * n / B            (n = bytes one rank sends)
    send/recv(n)                             a + n / B

A group spanning several tiers runs either flat (one ring bottlenecked by its slowest tier) or
hierarchically, one phase per tier: all_reduce = reduce_scatter inside, all_reduce across on the
1/f_inner shard, all_gather inside. With inner tiers at least as fast as outer ones, the
hierarchical cost never exceeds the flat ring on the slowest tier (a tested invariant). `auto`
takes the cheaper, as NCCL's tuner does. All-to-all traffic to different tiers moves concurrently
on separate links, so its time is the slowest tier's share.

A tier may carry end-to-end measurements per collective kind and group size (`Tier.collectives`, what
`trex calibrate` times for a CPU's gloo, whose kinds are different algorithms on processes sharing the
cores); a group on that one tier, of a measured size, is priced by the measurement instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from trex.cost_model.cluster import Cluster, Level, Placement, Tier


def _measured(kind: str, nbytes: float, placement: Placement) -> float | None:
    """A group on one tier whose `kind` was timed end to end over groups of its size (a calibrated CPU's gloo):
    that measurement, which already holds the algorithm gloo runs and the cores its processes share."""
    if len(placement.levels) != 1:
        return None
    level = placement.levels[0]
    measured = level.tier.measured(kind, level.fanout) if level.fanout == placement.size else None
    return None if measured is None else measured.seconds(nbytes)


Algorithm = Literal["auto", "flat", "tree", "hierarchical"]
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def _ring(tier: Tier, f: int, nbytes: float, passes: int) -> float:
    if f <= 1 or nbytes <= 0:
        return 0.0
    return passes * ((f - 1) * tier.latency_s + (f - 1) / f * nbytes / tier.bandwidth(f - 1))


def _tree_all_reduce(tier: Tier, f: int, nbytes: float) -> float:
    if f <= 1 or nbytes <= 0:
        return 0.0
    return 2 * math.ceil(math.log2(f)) * tier.latency_s + 2 * nbytes / tier.bandwidth(1)


def _flat_tier(placement: Placement) -> Tier:
    """The tier a flat ring over the whole group is limited by: the slowest one it crosses."""
    return min(
        (level.tier for level in placement.levels), key=lambda t: (t.bandwidth(placement.size - 1), -t.latency_s)
    )


def _flat_latency(placement: Placement) -> float:
    return max(level.tier.latency_s for level in placement.levels)


def all_gather(nbytes: float, placement: Placement, algorithm: Algorithm = "auto") -> float:
    """Seconds to all-gather a buffer of `nbytes` (the gathered size) over the group."""
    return _gather_like(nbytes, placement, algorithm, "all_gather")


def reduce_scatter(nbytes: float, placement: Placement, algorithm: Algorithm = "auto") -> float:
    """Seconds to reduce-scatter a buffer of `nbytes` (the unreduced input size) over the group."""
    return _gather_like(nbytes, placement, algorithm, "reduce_scatter")


def _gather_like(nbytes: float, placement: Placement, algorithm: Algorithm, kind: str) -> float:
    if placement.size <= 1 or nbytes <= 0:
        return 0.0
    measured = _measured(kind, nbytes, placement)
    if measured is not None:
        return measured
    if len(placement.levels) == 1:
        level = placement.levels[0]
        return _ring(level.tier, level.fanout, nbytes, 1)
    g = placement.size
    flat = (g - 1) * _flat_latency(placement) + (g - 1) / g * nbytes / _flat_tier(placement).bandwidth(g - 1)
    hierarchical = _hier_gather(nbytes, placement.levels)
    if algorithm == "flat":
        return flat
    if algorithm == "hierarchical":
        return hierarchical
    return min(flat, hierarchical)


def _hier_gather(nbytes: float, levels: Sequence[Level]) -> float:
    """Inner phase on the full buffer, each outer phase on the 1/(product of inner fanouts) shard."""
    total, inner = 0.0, 1
    for level in levels:
        total += _ring(level.tier, level.fanout, nbytes / inner, 1)
        inner *= level.fanout
    return total


def all_reduce(nbytes: float, placement: Placement, algorithm: Algorithm = "auto") -> float:
    """Seconds to all-reduce `nbytes` over the group (auto: the cheapest of ring, tree, hierarchical)."""
    if placement.size <= 1 or nbytes <= 0:
        return 0.0
    measured = _measured("all_reduce", nbytes, placement)
    if measured is not None:
        return measured
    g = placement.size
    tier = _flat_tier(placement)
    ring = 2 * (g - 1) * _flat_latency(placement) + 2 * (g - 1) / g * nbytes / tier.bandwidth(g - 1)
    tree = 2 * math.ceil(math.log2(g)) * _flat_latency(placement) + 2 * nbytes / tier.bandwidth(1)
    # reduce-scatter inward-out, then all-gather outward-in: twice the gather cost
    hierarchical = 2 * _hier_gather(nbytes, placement.levels)
    if algorithm == "flat":
        return ring
    if algorithm == "tree":
        return tree
    if algorithm == "hierarchical":
        return hierarchical
    return min(ring, tree, hierarchical)


def all_to_all(nbytes_per_rank: float, placement: Placement) -> float:
    """Seconds for a uniform all-to-all: each rank sends `nbytes_per_rank` spread evenly over the group."""
    if placement.size <= 1 or nbytes_per_rank <= 0:
        return 0.0
    measured = _measured("all_to_all", nbytes_per_rank, placement)
    if measured is not None:
        return measured
    return max(all_to_all_tier_times(nbytes_per_rank, placement).values())


def all_to_all_tier_bytes(nbytes_per_rank: float, placement: Placement) -> dict[str, float]:
    """Bytes one rank pushes over each tier in a uniform all-to-all (its own share stays local)."""
    g = placement.size
    out, inner = {}, 1
    for level in placement.levels:
        reach = inner * level.fanout
        out[level.tier.name] = nbytes_per_rank * (reach - inner) / g
        inner = reach
    return out


def all_to_all_tier_times(nbytes_per_rank: float, placement: Placement) -> dict[str, float]:
    per_tier = all_to_all_tier_bytes(nbytes_per_rank, placement)
    return {
        level.tier.name: tier_transfer(level.tier, per_tier[level.tier.name], level.fanout - 1)
        for level in placement.levels
    }


def tier_transfer(tier: Tier, nbytes: float, peers: int = 1) -> float:
    """One device pushing `nbytes` over `tier` to `peers` destinations concurrently."""
    if nbytes <= 0:
        return 0.0
    return tier.latency_s + nbytes / tier.bandwidth(max(1, peers))


def all_to_all_v(send_bytes: Sequence[Sequence[float]], ranks: Sequence[int], cluster: Cluster) -> float:
    """Seconds for an all-to-all with uneven splits: `send_bytes[i][j]` bytes from ranks[i] to ranks[j].

    Every rank's traffic on every tier moves concurrently; the busiest (rank, tier, direction) sets
    the time, as the slowest participant finishes last.
    """
    g = len(ranks)
    if g <= 1:
        return 0.0
    if len(send_bytes) != g or any(len(row) != g for row in send_bytes):
        raise ValueError(f"all_to_all_v: send_bytes must be {g}x{g} for {g} ranks")
    busiest = 0.0
    for i in range(g):
        out: dict[Tier, float] = {}
        inward: dict[Tier, float] = {}
        for j in range(g):
            if i == j:
                continue
            tier_out = cluster.tier_between(ranks[i], ranks[j])
            out[tier_out] = out.get(tier_out, 0.0) + send_bytes[i][j]
            inward[tier_out] = inward.get(tier_out, 0.0) + send_bytes[j][i]
        for tier in set(out) | set(inward):
            volume = max(out.get(tier, 0.0), inward.get(tier, 0.0))
            busiest = max(busiest, tier_transfer(tier, volume, g - 1))
    return busiest


def send_recv(nbytes: float, tier: Tier) -> float:
    """Seconds for one point-to-point message over `tier`."""
    if nbytes <= 0:
        return 0.0
    return tier.latency_s + nbytes / tier.bandwidth(1)


def collective_time(kind: str, nbytes: float, placement: Placement, algorithm: Algorithm = "auto") -> float:
    """Dispatch by name; `nbytes` means what the single-collective function above says."""
    if kind == "all_reduce":
        return all_reduce(nbytes, placement, algorithm)
    if kind == "all_gather":
        return all_gather(nbytes, placement, algorithm)
    if kind == "reduce_scatter":
        return reduce_scatter(nbytes, placement, algorithm)
    if kind == "all_to_all":
        return all_to_all(nbytes, placement)
    if kind == "send_recv":
        return send_recv(nbytes, placement.slowest) if placement.levels else 0.0
    raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}")
