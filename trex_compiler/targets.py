"""Targets: the hardware a compiled program is planned for and, where present, runs on.

A target names a device profile and a cluster topology (priced by `trex.cost_model`). Planning for
any target needs no such hardware; executing needs a device of the target's kind in this process.
"""

from __future__ import annotations

from dataclasses import dataclass

from trex.errors import TrexError, UnknownNameError


@dataclass(frozen=True)
class Target:
    name: str
    device_type: str  # the torch device type programs for this target execute on
    description: str


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("cpu", "cpu", "this machine's CPU (calibrated by `trex calibrate`)"),
        Target("a100", "cuda", "NVIDIA A100 SXM 80GB, 8 per node, NVLink3 + InfiniBand"),
        Target("h100", "cuda", "NVIDIA H100 SXM, 8 per node, NVLink4 + InfiniBand NDR"),
        Target("h800", "cuda", "NVIDIA H800 SXM (reduced NVLink), 8 per node + InfiniBand"),
        Target("h200", "cuda", "NVIDIA H200 SXM 141GB, 8 per node, NVLink4 + InfiniBand"),
        Target("ascend-910b", "npu", "Huawei Atlas 800T A2: 8 Ascend 910B per node, HCCS + RoCE"),
        Target("ascend-910c", "npu", "Huawei Ascend 910C (2 dies per package)"),
        Target("cloudmatrix384", "npu", "Huawei CloudMatrix384 supernode: 384 Ascend 910C on the Unified Bus"),
    )
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
