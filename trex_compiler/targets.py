"""Targets: the hardware a compiled program is planned for and, where present, runs on.

A target is a built-in machine of the cost model's hardware catalog (`trex.cost_model.catalog`):
`Target.resolve()` gives its `(DeviceProfile, Cluster)`. Planning for any target needs no such
hardware; executing needs a device of the target's kind in this process.
"""

from __future__ import annotations

from dataclasses import dataclass

from trex.cost_model.catalog import CATALOG, resolve_target
from trex.cost_model.cluster import Cluster
from trex.cost_model.devices import DeviceProfile
from trex.errors import TrexError, UnknownNameError


@dataclass(frozen=True)
class Target:
    name: str
    device_type: str  # the torch device type programs for this target execute on
    description: str

    def resolve(self) -> tuple[DeviceProfile, Cluster]:
        """This target's device profile and cluster (for `cpu`, as `trex calibrate` measured it)."""
        return resolve_target(self.name)


TARGETS: dict[str, Target] = {
    name: Target(name, entry.device_type, entry.description) for name, entry in CATALOG.items()
}


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise UnknownNameError("target", name, TARGETS)
    return TARGETS[name]


def check_executable(target: Target, device_types: set[str]) -> None:
    """Raise unless a model whose tensors live on `device_types` can execute for `target`."""
    foreign = {d for d in device_types if d not in (target.device_type, "meta")}
    if foreign:
        raise TrexError(
            f"target {target.name!r} executes on {target.device_type} devices, but the model's parameters are on "
            f"{', '.join(sorted(foreign))}; move the model to a {target.device_type} device, or compile for "
            f"target='{'cpu' if 'cpu' in foreign else sorted(foreign)[0]}' (planning for {target.name!r} needs no hardware: "
            "see `trex capture --meta`)"
        )
