"""Where process groups land on a cluster's tiers, and which placements the planner accepts.

Ranks follow Megatron's order (tp fastest, then cp, dp, pp; expert groups laid over a stage's ranks
etp fastest, then ep), and consecutive ranks share the innermost domain (`trex.cost_model.cluster`).
A family of groups of `size` ranks at `stride` tiles the ranks in blocks of size * stride; every
instance, not only rank 0's, must sit inside one domain of the fastest tier that can hold it:

* a tensor-parallel group (its collectives run twice per layer) and an expert-parallel group (two
  all-to-alls per MoE layer) that straddled two domains of that tier would run at the speed of the
  tier above it, and
* the cost model prices a group by the placement of rank 0's instance, so a plan whose other
  instances straddle a domain boundary would be priced too optimistically.

Example: 1024 CloudMatrix384 dies fill one 768-die supernode and a third of a second; an EP group
of 512 starting at rank 512 would span both supernodes over RoCE, so ep=512 is rejected there while
ep=256 (every instance inside a supernode) is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from trex.cost_model.cluster import Cluster, Tier


@dataclass(frozen=True)
class GroupPlacement:
    kind: str  # "tp", "ep", ...
    size: int
    stride: int
    tier: Tier  # the fastest tier whose domains can hold the group
    straddles: int  # instances that cross a domain boundary of that tier

    @property
    def ok(self) -> bool:
        return self.straddles == 0

    def describe(self) -> str:
        where = f"inside one {self.tier.name} domain ({self.tier.size or 'all'} devices)"
        if self.ok:
            return f"{self.kind} groups of {self.size}: {where}"
        return f"{self.kind} groups of {self.size} (stride {self.stride}): {self.straddles} instance(s) cross a {self.tier.name} domain boundary"


def holding_tier(cluster: Cluster, span: int) -> Tier:
    """The innermost tier whose domain has room for `span` consecutive ranks."""
    for tier in cluster.tiers:
        if tier.size is None or tier.size >= span:
            return tier
    return cluster.tiers[-1]


@lru_cache(maxsize=4096)
def _straddling(devices: int, size: int, stride: int, domain: int | None) -> int:
    if domain is None or size <= 1:
        return 0
    block = size * stride
    count = 0
    for base in range(0, devices - devices % block, block):
        for offset in range(stride):
            first = base + offset
            last = first + (size - 1) * stride
            if first // domain != last // domain:
                count += 1
    return count


def group_placement(cluster: Cluster, kind: str, size: int, stride: int) -> GroupPlacement:
    """Place the family of `size`-rank groups at `stride` on the cluster's `devices` ranks."""
    span = (size - 1) * stride + 1
    tier = holding_tier(cluster, span)
    return GroupPlacement(kind, size, stride, tier, _straddling(cluster.devices, size, stride, tier.size))


def placement_problems(cluster: Cluster, tp: int, ep: int, etp: int) -> list[str]:
    """Why these tensor- and expert-parallel groups cannot be placed well (empty when they can)."""
    problems = []
    for placement in (
        group_placement(cluster, "tp", tp, 1),
        group_placement(cluster, "etp", etp, 1),
        group_placement(cluster, "ep", ep, etp),
    ):
        if not placement.ok:
            problems.append(placement.describe())
    return problems
