"""Serving cluster files: which machine types a deployment may use, and how many devices of each.

A cluster file is TOML with one `[[machines]]` table per machine type:

    [[machines]]
    device = "h100"          # a name from trex.cost_model's device catalog, or a profile file
    count = 16               # devices of this type
    devices_per_node = 8     # optional; tensor parallelism stays inside a node
    interconnect_gbs = 450   # optional; per-device TP link bandwidth (default: the catalog's intra-node tier)

Device profiles are the cost model's (`trex.cost_model.devices.get_device`); nothing here keeps its
own table of devices.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trex.cost_model.catalog import BUILTIN_CLUSTERS
from trex.cost_model.cluster import Tier
from trex.cost_model.devices import DeviceProfile, get_device
from trex.errors import TrexError
from trex.workloads.serving.errors import ServingError

# PCIe Gen4 x16: 32 GB/s per direction; the fallback TP link of a device the catalog has no node for.
PCIE_GEN4_GBS = 32.0
_MACHINE_FIELDS = {
    "device": "a device name or profile file",
    "count": "number of devices of this type",
    "devices_per_node": "devices in one server (TP stays inside it)",
    "name": "a label for this machine type",
    "interconnect_gbs": "per-device tensor-parallel link bandwidth in GB/s",
    "interconnect_latency_us": "per-message latency of that link in microseconds",
}


@dataclass(frozen=True)
class MachineType:
    """`count` devices of one kind, in servers of `devices_per_node`, with the link TP uses inside a server."""

    name: str
    device: DeviceProfile
    count: int
    devices_per_node: int
    link: Tier

    def tp_degrees(self) -> list[int]:
        """Tensor-parallel degrees an instance may use: powers of two that fit in one server."""
        limit = min(self.devices_per_node, self.count)
        return [2**i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else []

    def allreduce_s(self, nbytes: float, tp: int) -> float:
        """An all-reduce of `nbytes` over `tp` devices of this server: 2(t-1)/t of the bytes cross each
        device's link (ring bandwidth term); small messages take a tree/one-shot path, 2 log2(t) latencies."""
        if tp <= 1 or nbytes <= 0:
            return 0.0
        bandwidth = self.link.bandwidth(tp - 1)
        return 2.0 * (tp - 1) / tp * nbytes / bandwidth + 2.0 * math.ceil(math.log2(tp)) * self.link.latency_s


@dataclass(frozen=True)
class ServingCluster:
    name: str
    machines: tuple[MachineType, ...]

    @property
    def devices(self) -> int:
        return sum(m.count for m in self.machines)

    def describe(self) -> str:
        return ", ".join(f"{m.count}x {m.name}" for m in self.machines)


def _default_link(device: DeviceProfile, devices_per_node: int) -> Tier:
    """The intra-node tier of the catalog cluster built from this device (a100, h100, ascend-910b...)."""
    for cluster in BUILTIN_CLUSTERS.values():
        if cluster.device.name == device.name or (
            device.name.startswith("ascend-910b") and cluster.name == "ascend-910b"
        ):
            return cluster.tiers[0]
    return Tier(
        "pcie-gen4",
        devices_per_node,
        PCIE_GEN4_GBS,
        10.0,
        0.8,
        "switch",
        f"assumed: {device.name} is not in the cost model's cluster catalog; PCIe Gen4 x16 between its devices",
    )


def machine_from_dict(table: dict[str, Any], source: str, index: int) -> MachineType:
    where = f"{source}: machines[{index}]"
    unknown = sorted(set(table) - set(_MACHINE_FIELDS))
    if unknown:
        raise ServingError(
            f"{where}: unknown field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(_MACHINE_FIELDS))}"
        )
    if "device" not in table or "count" not in table:
        raise ServingError(
            f"{where}: needs `device` ({_MACHINE_FIELDS['device']}) and `count` ({_MACHINE_FIELDS['count']})"
        )
    try:
        device = get_device(table["device"])
    except TrexError as error:
        raise ServingError(f"{where}: {error}") from None
    count = table["count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ServingError(f"{where}: count must be a positive integer (got {count!r})")
    per_node = table.get("devices_per_node", min(count, 8))
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        raise ServingError(f"{where}: devices_per_node must be a positive integer (got {per_node!r})")
    link = _default_link(device, per_node)
    if "interconnect_gbs" in table:
        gbs = table["interconnect_gbs"]
        if isinstance(gbs, bool) or not isinstance(gbs, (int, float)) or gbs <= 0:
            raise ServingError(f"{where}: interconnect_gbs must be a positive number of GB/s (got {gbs!r})")
        latency = float(table.get("interconnect_latency_us", link.latency_us))
        link = Tier("custom", per_node, float(gbs), latency, 0.85, "switch", f"{source}: interconnect_gbs = {gbs}")
    return MachineType(str(table.get("name", device.name)), device, count, per_node, link)


def cluster_from_dict(data: dict[str, Any], source: str = "<dict>") -> ServingCluster:
    machines = data.get("machines")
    if not isinstance(machines, list) or not machines:
        raise ServingError(
            f"{source}: a serving cluster needs at least one [[machines]] table with device and count, e.g.\n"
            '  [[machines]]\n  device = "h100"\n  count = 8'
        )
    parsed = tuple(machine_from_dict(table, source, i) for i, table in enumerate(machines))
    names = [m.name for m in parsed]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ServingError(
            f"{source}: machine type(s) {', '.join(duplicates)} listed twice; "
            "merge their counts or give each a distinct `name`"
        )
    return ServingCluster(str(data.get("name", Path(source).stem)), parsed)


def load_serving_cluster(path: str | Path) -> ServingCluster:
    path = Path(path)
    if not path.exists():
        raise ServingError(
            f"cluster file {path} does not exist; write a TOML file with one [[machines]] table per machine type"
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ServingError(f"{path}: not valid TOML ({error})") from None
    return cluster_from_dict(data, str(path))
