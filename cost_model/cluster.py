"""Cluster topologies: devices in nested domains (tiers), and where a process group lands on them.

A cluster is a device profile plus tiers listed from the innermost (fastest) outwards, e.g. NVLink
inside an 8-GPU node, then InfiniBand across nodes. Each tier has a domain size (devices per
domain; the outermost tier spans the whole cluster), a per-device bandwidth per direction, a
per-message latency, an achievable fraction of that bandwidth, and a topology:

* `switch` - every device reaches every other at the full per-device bandwidth (NVSwitch, a
  rail-optimised fabric, the CloudMatrix Unified Bus).
* `full_mesh` - point-to-point links of `bandwidth_gbs` each (Ascend HCCS inside an Atlas 800T A2);
  a group of f devices can drive at most f-1 links at once, so small groups get little bandwidth.

Ranks are numbered so that consecutive ranks share the innermost domain (rank r sits in domain
r // size of each tier), the layout Megatron and torchrun produce. `placement(ranks)` turns a group
into levels (tier, fanout): how many sub-domains the group spans at each tier.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from trex.cost_model.devices import DeviceProfile, device_profile_from_dict, get_device, read_profile_file
from trex.errors import TrexError

Topology = Literal["switch", "full_mesh"]


@dataclass(frozen=True)
class MeasuredCollective:
    """One collective kind timed end to end on a tier, over groups of `group` ranks: seconds = latency + bytes /
    bandwidth (bytes as `trex.cost_model.collectives` counts them for that kind). A CPU's gloo implements each kind
    differently (ring all-reduce, gathers by broadcast, all-to-all as pairwise sends) and its processes share the
    cores, so no single (latency, bandwidth) pair fits them all; `trex calibrate` measures each one."""

    kind: str
    group: int
    latency_us: float
    bandwidth_gbs: float

    def seconds(self, nbytes: float) -> float:
        return self.latency_us * 1e-6 + nbytes / (self.bandwidth_gbs * 1e9)


@dataclass(frozen=True)
class Tier:
    name: str
    size: int | None  # devices per domain; None for the outermost tier (the whole cluster)
    bandwidth_gbs: float  # per device per direction (switch) or per link (full_mesh), GB/s
    latency_us: float  # per message / per algorithm step
    efficiency: float = 0.85  # achievable fraction of bandwidth for large messages
    topology: Topology = "switch"
    source: str = ""
    collectives: tuple[MeasuredCollective, ...] = ()  # measured kinds (a calibrated CPU's gloo); else the formulas

    def measured(self, kind: str, group: int) -> MeasuredCollective | None:
        """The measurement of `kind` over `group` ranks on this tier, if one was taken."""
        return next((m for m in self.collectives if m.kind == kind and m.group == group), None)

    def bandwidth(self, peers: int) -> float:
        """Bytes/s one device can push to `peers` other members of its group over this tier."""
        if self.topology == "full_mesh":
            links = max(1, peers) if self.size is None else max(1, min(peers, self.size - 1))
            return links * self.bandwidth_gbs * 1e9 * self.efficiency
        return self.bandwidth_gbs * 1e9 * self.efficiency

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


@dataclass(frozen=True)
class Level:
    """One tier of a group's placement: `fanout` sub-domains talk over `tier`."""

    tier: Tier
    fanout: int


@dataclass(frozen=True)
class Placement:
    """A process group mapped onto a cluster: levels from the innermost tier outwards."""

    size: int
    levels: tuple[Level, ...]  # only tiers the group actually crosses (fanout > 1)

    @property
    def slowest(self) -> Tier | None:
        return self.levels[-1].tier if self.levels else None

    def describe(self) -> str:
        if not self.levels:
            return f"{self.size} rank (local)"
        return " x ".join(f"{level.fanout} over {level.tier.name}" for level in self.levels)


@dataclass(frozen=True)
class Cluster:
    name: str
    description: str
    device: DeviceProfile
    tiers: tuple[Tier, ...]
    devices: int
    max_devices: int | None = None  # None: grows by adding domains of the outermost tier
    unit: int | None = None  # devices allocated together (a server); defaults to the innermost tier's domain
    sources: tuple[str, ...] = ()
    # CPU cores the devices share when they are processes on one host (a calibrated `cpu`); None: a device is
    # its own processor (GPUs, NPUs). More single-threaded ranks than cores time-share them.
    cores: int | None = None

    @property
    def time_share(self) -> float:
        """How many ranks take turns on each core: compute runs this many times slower than one rank alone."""
        return max(1.0, self.devices / self.cores) if self.cores else 1.0

    @property
    def node_size(self) -> int:
        """Devices in the largest bounded domain below the outermost tier (a node or supernode)."""
        bounded = [t.size for t in self.tiers if t.size is not None]
        return bounded[-1] if bounded else 1

    def sized(self, devices: int) -> Cluster:
        """The same cluster with `devices` devices: whole servers once past one server."""
        if devices < 1:
            raise TrexError(f"--devices must be at least 1 (got {devices})")
        if self.max_devices is not None and devices > self.max_devices:
            raise TrexError(f"cluster {self.name!r} holds at most {self.max_devices} devices (asked for {devices})")
        unit = self.unit or (self.tiers[0].size or 1)
        if devices > unit and devices % unit:
            lower = devices - devices % unit
            raise TrexError(
                f"cluster {self.name!r} allocates whole servers of {unit} devices; {devices} is not a multiple of {unit} "
                f"(use {lower} or {lower + unit})"
            )
        return replace(self, devices=devices)

    def with_device(self, device: DeviceProfile) -> Cluster:
        return replace(self, device=device)

    def placement(self, ranks: tuple[int, ...] | list[int]) -> Placement:
        ranks = tuple(ranks)
        return _placement(self.tiers, ranks)

    def strided_placement(self, size: int, stride: int, start: int = 0) -> Placement:
        """Placement of the regular group {start + stride * i : i < size}."""
        return _strided_placement(self.tiers, size, stride, start)

    def tier_between(self, a: int, b: int) -> Tier:
        """The innermost tier whose domain holds both ranks."""
        for tier in self.tiers:
            if tier.size is None or a // tier.size == b // tier.size:
                return tier
        return self.tiers[-1]


def _placement(tiers: tuple[Tier, ...], ranks: tuple[int, ...]) -> Placement:
    """Levels of a group: at each tier, the most sub-domains one domain of it holds (an uneven group
    is priced by its most crowded domain)."""
    if len(set(ranks)) != len(ranks):
        raise TrexError(f"a process group lists a rank twice: {sorted(ranks)}")
    below = {r: r for r in ranks}  # each rank's domain at the tier below (itself, at first)
    levels = []
    for tier in tiers:
        here = {r: (0 if tier.size is None else r // tier.size) for r in ranks}
        members: dict[int, set[int]] = {}
        for r in ranks:
            members.setdefault(here[r], set()).add(below[r])
        fanout = max(len(m) for m in members.values())
        if fanout > 1:
            levels.append(Level(tier, fanout))
        below = here
    return Placement(len(ranks), tuple(levels))


@lru_cache(maxsize=4096)
def _strided_placement(tiers: tuple[Tier, ...], size: int, stride: int, start: int) -> Placement:
    return _placement(tiers, tuple(start + stride * i for i in range(size)))


# ---------------------------------------------------------------------------------------------
# Cluster files: a [device] table (or `device = "h100"`) and a [cluster] table with [[cluster.tiers]].

_TIER_FIELDS = {
    "name": "a label, e.g. 'nvlink'",
    "size": "devices per domain (omit for the outermost tier)",
    "bandwidth_gbs": "GB/s per device per direction (per link for full_mesh)",
    "latency_us": "microseconds per message",
    "efficiency": "achievable fraction (0-1] of bandwidth",
    "topology": "'switch' or 'full_mesh'",
    "source": "where the numbers come from",
    "collectives": "measured kinds: tables of kind, group, latency_us, bandwidth_gbs (written by `trex calibrate`)",
}


def _tier_fail(source: str, index: int, field: str, problem: str, fix: str) -> TrexError:
    return TrexError(f"cluster file {source}: field 'cluster.tiers[{index}].{field}' {problem}; {fix}")


def cluster_from_dict(data: dict[str, Any], source: str = "<dict>") -> Cluster:
    if "cluster" not in data or not isinstance(data["cluster"], dict):
        raise TrexError(
            f"cluster file {source}: table 'cluster' is missing; add [cluster] with name and [[cluster.tiers]]"
        )
    table = data["cluster"]
    device_entry = data.get("device", table.get("device"))
    if device_entry is None:
        raise TrexError(
            f"cluster file {source}: field 'device' is missing; name a built-in device (e.g. device = \"h100\") or add a [device] table"
        )
    device = (
        get_device(device_entry) if isinstance(device_entry, str) else device_profile_from_dict(device_entry, source)
    )
    tiers_data = table.get("tiers")
    if not isinstance(tiers_data, list) or not tiers_data:
        raise TrexError(
            f"cluster file {source}: field 'cluster.tiers' is missing or empty; add one [[cluster.tiers]] per tier, innermost first"
        )
    tiers = []
    for index, tier in enumerate(tiers_data):
        for key in tier:
            if key not in _TIER_FIELDS:
                raise _tier_fail(source, index, key, "is not a tier field", f"valid fields: {', '.join(_TIER_FIELDS)}")
        for key in ("name", "bandwidth_gbs", "latency_us"):
            if key not in tier:
                raise _tier_fail(source, index, key, "is missing", f"add it: {_TIER_FIELDS[key]}")
        for key in ("bandwidth_gbs", "latency_us", "efficiency"):
            value = tier.get(key, 0.85 if key == "efficiency" else None)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or value <= 0
                or (key == "efficiency" and value > 1)
            ):
                raise _tier_fail(
                    source,
                    index,
                    key,
                    f"must be a positive number{' at most 1' if key == 'efficiency' else ''} (got {value!r})",
                    _TIER_FIELDS[key],
                )
        size = tier.get("size")
        last = index == len(tiers_data) - 1
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise _tier_fail(source, index, "size", f"must be a positive integer (got {size!r})", _TIER_FIELDS["size"])
        if size is None and not last:
            raise _tier_fail(source, index, "size", "is missing", "only the outermost tier may omit its domain size")
        if tiers and size is not None and tiers[-1].size is not None and size % tiers[-1].size:
            raise _tier_fail(
                source,
                index,
                "size",
                f"({size}) is not a multiple of the tier inside it ({tiers[-1].size})",
                "domains must nest",
            )
        topology = tier.get("topology", "switch")
        if topology not in ("switch", "full_mesh"):
            raise _tier_fail(source, index, "topology", f"is {topology!r}", "use 'switch' or 'full_mesh'")
        tiers.append(
            Tier(
                tier["name"],
                size,
                float(tier["bandwidth_gbs"]),
                float(tier["latency_us"]),
                float(tier.get("efficiency", 0.85)),
                topology,
                tier.get("source", ""),
                _measured_collectives(tier.get("collectives", []), source, index),
            )
        )
    if tiers[-1].size is not None:
        tiers.append(replace(tiers[-1], name=f"{tiers[-1].name}-outer", size=None))
    name = table.get("name", Path(source).stem)
    devices = table.get("devices", tiers[0].size or 1)
    return Cluster(
        name,
        table.get("description", name),
        device,
        tuple(tiers),
        int(devices),
        table.get("max_devices"),
        table.get("unit"),
        cores=_cores(table.get("cores"), source),
    )


def _measured_collectives(entries: Any, source: str, index: int) -> tuple[MeasuredCollective, ...]:
    fields = ("kind", "group", "latency_us", "bandwidth_gbs")
    if not isinstance(entries, list) or any(not isinstance(e, dict) or set(e) != set(fields) for e in entries):
        raise _tier_fail(
            source, index, "collectives", "must be a list of tables", f"each with exactly {', '.join(fields)}"
        )
    return tuple(
        MeasuredCollective(str(e["kind"]), int(e["group"]), float(e["latency_us"]), float(e["bandwidth_gbs"]))
        for e in entries
    )


def _cores(value: Any, source: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TrexError(f"cluster file {source}: cluster.cores must be a positive integer (got {value!r})")
    return value


def load_cluster(path: str | Path) -> Cluster:
    return cluster_from_dict(read_profile_file(path), source=str(path))


def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    from trex.cost_model.devices import device_profile_to_dict

    tiers = []
    for tier in cluster.tiers:
        entry: dict[str, Any] = {
            "name": tier.name,
            "bandwidth_gbs": tier.bandwidth_gbs,
            "latency_us": tier.latency_us,
            "efficiency": tier.efficiency,
            "topology": tier.topology,
            "source": tier.source,
        }
        if tier.size is not None:
            entry["size"] = tier.size
        if tier.collectives:
            entry["collectives"] = [
                {"kind": m.kind, "group": m.group, "latency_us": m.latency_us, "bandwidth_gbs": m.bandwidth_gbs}
                for m in tier.collectives
            ]
        tiers.append(entry)
    return {
        **device_profile_to_dict(cluster.device),
        "cluster": {
            "name": cluster.name,
            "description": cluster.description,
            "devices": cluster.devices,
            "tiers": tiers,
            **({"cores": cluster.cores} if cluster.cores else {}),
        },
    }
