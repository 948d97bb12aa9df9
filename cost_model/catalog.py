"""The hardware catalog: one table of the built-in machines trex plans for and runs on.

Each entry is a cluster (its device profile, its tiers from the innermost outwards) plus the torch
device type programs for it execute on. Everything that names hardware reads this table: cluster
names for the cost model and the planner (`get_cluster`), `trex.targets` (a target resolves to a
`(DeviceProfile, Cluster)` here), and the validation of published runs (which cluster a row's device
sits in). Device profiles themselves are `trex.cost_model.devices.BUILTIN_DEVICES`; each cluster
names one. Bandwidths are per device per direction.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trex.cost_model.cluster import Cluster, Tier, load_cluster
from trex.cost_model.devices import BUILTIN_DEVICES, DeviceProfile, calibrated_cpu_path, get_device
from trex.errors import UnknownNameError

_NVLINK3 = Tier(
    "nvlink3",
    8,
    300.0,
    3.0,
    0.78,
    "switch",
    "NVLink3 600 GB/s bidirectional; NCCL all-reduce bus bandwidth ~230-240 GB/s on DGX A100",
)
_HDR_IB = Tier(
    "infiniband-hdr",
    None,
    25.0,
    6.0,
    0.88,
    "switch",
    "Selene: 8x HDR 200 Gb/s per node, 25 GB/s per GPU (Korthikanti et al. 2022)",
)
_NVLINK4 = Tier(
    "nvlink4", 8, 450.0, 3.0, 0.80, "switch", "NVLink4 900 GB/s bidirectional; NCCL bus bandwidth ~360 GB/s"
)
_NDR_IB = Tier(
    "infiniband-ndr", None, 50.0, 6.0, 0.82, "switch", "NDR 400 Gb/s per GPU (50 GB/s); ~40-42 GB/s effective"
)
_NVLINK_H800 = Tier(
    "nvlink-h800",
    8,
    200.0,
    3.0,
    0.80,
    "switch",
    "H800 NVLink 400 GB/s bidirectional; DeepSeek measured ~160 GB/s (V3 report Sec. 3.2.2)",
)
_IB_H800 = Tier(
    "infiniband-ndr",
    None,
    50.0,
    6.0,
    0.80,
    "switch",
    "8x 400 Gb/s IB per node; ~40 GB/s effective per GPU (DeepSeek-V3 report)",
)
_HCCS = Tier(
    "hccs",
    8,
    56.0,
    5.0,
    0.85,
    "full_mesh",
    "Atlas 800T A2: HCCS full mesh, ~56 GB/s per peer link, ~392 GB/s aggregate",
)
_ROCE_200 = Tier("roce-200g", None, 25.0, 10.0, 0.85, "switch", "RoCE 200 Gb/s per NPU (Pangu Ultra report Sec. 4.1)")
_DIE_TO_DIE = Tier(
    "die-to-die",
    2,
    540.0,
    1.0,
    0.80,
    "switch",
    "910C package: two dies paired on-package (assumed ~540 GB/s); CloudMatrix384 paper",
)
_UB_NODE = Tier(
    "ub-node",
    16,
    196.0,
    2.0,
    0.80,
    "switch",
    "910C server: 8 packages / 16 dies on the Unified Bus, >392 GB/s per package (CloudMatrix384 paper)",
)
_UB_SUPERNODE = Tier(
    "unified-bus",
    768,
    196.0,
    2.0,
    0.80,
    "switch",
    "CloudMatrix384: UB non-blocking all-to-all over 384 packages (768 dies), >392 GB/s per package, <1 us latency",
)
_ROCE_400_DIE = Tier(
    "roce-400g", None, 25.0, 10.0, 0.85, "switch", "RDMA 400 Gb/s per 910C package across supernodes (25 GB/s per die)"
)

# Latency of a gloo message between local processes before `trex calibrate` has measured it.
UNCALIBRATED_GLOO_LATENCY_US = 50.0


@dataclass(frozen=True)
class CatalogEntry:
    """One built-in machine: the cluster and the torch device type its programs execute on."""

    cluster: Cluster
    device_type: str  # "cuda", "npu" or "cpu"

    @property
    def name(self) -> str:
        return self.cluster.name

    @property
    def description(self) -> str:
        return self.cluster.description


def _catalog() -> dict[str, CatalogEntry]:
    d = BUILTIN_DEVICES
    entries = [
        CatalogEntry(
            Cluster(
                "a100",
                "DGX A100 / Selene: 8x A100 SXM 80GB per node, NVLink3, 8x HDR InfiniBand per node",
                d["a100"],
                (_NVLINK3, _HDR_IB),
                8,
            ),
            "cuda",
        ),
        CatalogEntry(
            Cluster(
                "h100",
                "DGX H100: 8x H100 SXM per node, NVLink4, 8x NDR InfiniBand per node",
                d["h100"],
                (_NVLINK4, _NDR_IB),
                8,
            ),
            "cuda",
        ),
        CatalogEntry(
            Cluster(
                "h800",
                "8x H800 per node, reduced NVLink, 8x 400 Gb/s InfiniBand per node",
                d["h800"],
                (_NVLINK_H800, _IB_H800),
                8,
            ),
            "cuda",
        ),
        CatalogEntry(
            Cluster(
                "h200", "HGX H200: 8x H200 SXM per node, NVLink4, NDR InfiniBand", d["h200"], (_NVLINK4, _NDR_IB), 8
            ),
            "cuda",
        ),
        CatalogEntry(
            Cluster(
                "ascend-910b",
                "Atlas 800T A2: 8x Ascend 910B (64 GB) per node, HCCS full mesh, RoCE 200 Gb/s per NPU",
                d["ascend-910b"],
                (_HCCS, _ROCE_200),
                8,
            ),
            "npu",
        ),
        CatalogEntry(
            Cluster(
                "ascend-910c",
                "Ascend 910C servers: 8 packages (16 dies, one NPU each) per node on UB, RoCE across nodes",
                d["ascend-910c-die"],
                (_DIE_TO_DIE, _UB_NODE, _ROCE_400_DIE),
                16,
                unit=16,
            ),
            "npu",
        ),
        CatalogEntry(
            Cluster(
                "cloudmatrix384",
                "CloudMatrix384 supernode: 384 Ascend 910C (768 dies) on the Unified Bus; RoCE between supernodes",
                d["ascend-910c-die"],
                (_DIE_TO_DIE, _UB_SUPERNODE, _ROCE_400_DIE),
                768,
                unit=16,
            ),
            "npu",
        ),
        CatalogEntry(
            Cluster(
                "cpu",
                "this machine: CPU processes talking over gloo (loopback)",
                d["cpu"],
                (
                    Tier(
                        "gloo-loopback",
                        None,
                        2.0,
                        UNCALIBRATED_GLOO_LATENCY_US,
                        1.0,
                        "switch",
                        "uncalibrated default, not a measurement; `trex calibrate` measures gloo",
                    ),
                ),
                1,
            ),
            "cpu",
        ),
    ]
    return {e.name: e for e in entries}


CATALOG: dict[str, CatalogEntry] = _catalog()
BUILTIN_CLUSTERS: dict[str, Cluster] = {name: entry.cluster for name, entry in CATALOG.items()}


def cluster_names() -> list[str]:
    return sorted(CATALOG)


target_names = cluster_names  # every built-in cluster is a target of the same name


def get_cluster(name_or_path: str | Path, devices: int | None = None, device: str | Path | None = None) -> Cluster:
    """A named cluster (or a TOML/JSON cluster file), sized to `devices`, optionally with another device.

    `cpu` is this machine as `trex calibrate` measured it, when it has been calibrated."""
    key = str(name_or_path)
    if key == "cpu":
        path = calibrated_cpu_path()
        cluster = load_cluster(path) if path.exists() else BUILTIN_CLUSTERS["cpu"]
    elif key in BUILTIN_CLUSTERS:
        cluster = BUILTIN_CLUSTERS[key]
    elif Path(key).suffix in (".toml", ".json") or Path(key).exists():
        cluster = load_cluster(key)
    else:
        raise UnknownNameError("cluster", key, BUILTIN_CLUSTERS, hint="or pass a cluster file (.toml or .json)")
    if device is not None:
        cluster = cluster.with_device(get_device(device))
    return cluster.sized(devices) if devices is not None else cluster


def resolve_target(name: str) -> tuple[DeviceProfile, Cluster]:
    """A target name -> its device profile and cluster (the calibrated ones for `cpu`)."""
    if name not in CATALOG:
        raise UnknownNameError("target", name, CATALOG)
    cluster = get_cluster(name)
    return cluster.device, cluster


def device_type_of(name: str) -> str:
    """The torch device type a built-in target's programs execute on."""
    if name not in CATALOG:
        raise UnknownNameError("target", name, CATALOG)
    return CATALOG[name].device_type


def cluster_for_device(device: str) -> str:
    """The built-in cluster a device profile name sits in (`h100` -> `h100`, `ascend-910c-die` -> `ascend-910c`).

    Names that are not a built-in device (a profile file, a cluster name) are returned unchanged."""
    if device in CATALOG:
        return device
    for name, entry in CATALOG.items():
        if entry.cluster.device.name == device:
            return name
    return device
