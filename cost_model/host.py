"""The host side of eager training: the framework ops a layer issues, and when they set the pace.

In eager PyTorch (Megatron-LM, torchtitan, MindSpeed) the CPU issues every op: Python, the
dispatcher, autograd recording and the kernel launch. The device runs what was issued
asynchronously, so a stretch of work takes about max(host time, device time) while the host can
run ahead of the device (a two-stage flow shop whose queue never empties). A device->host
synchronisation drains that queue: a dropless MoE dispatcher copies token counts to the host to
size its buffers and grouped GEMMs, once per MoE layer forward, so the host cannot borrow slack
across that point. Time is then a sum over the stretches between synchronisations:

    t = sum_segments max(host_s, device_s)    (host_s = ops issued * host_op_us)

which is never less than max(sum host_s, sum device_s), the time without synchronisations.

`HostOps` counts what one layer issues per micro-batch; the counts come from trex's own captured
graphs (`count_host_ops`), one capture per layer structure, stored in `data/host_ops.toml` with
their provenance. Grouped GEMMs are counted apart: Transformer Engine's BF16 GroupedLinear issues one
cuBLAS GEMM per local expert (`nvte_multi_stream_cublas_gemm`), so their host cost scales with the
experts a device holds. The per-op host cost is a property of the host CPU and software stack and
lives in the device profile (`DeviceProfile.host_op_us`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Protocol

from trex.errors import TrexError

# Ops that launch one GEMM per local expert (grouped GEMMs and the fused expert MLP).
EXPERT_GEMM_OPS = frozenset(
    {
        "aten._grouped_mm",
        "aten._scaled_grouped_mm",
        "trex.grouped_mm",
        "trex.grouped_mm_weight_grad",
        "trex.extern_grouped_mm",
        "trex.extern_grouped_mm_weight_grad",
        "trex.moe_experts",
        "trex.moe_experts_backward",
    }
)


@dataclass(frozen=True)
class HostOps:
    """Framework ops the host issues for one layer and one micro-batch.

    `forward` and `backward` count the ops of the forward and backward graphs that are not views,
    waits or expert GEMMs; each grouped-GEMM call adds one op per local expert.
    """

    forward: int
    backward: int
    expert_gemms_forward: int = 0
    expert_gemms_backward: int = 0
    source: str = ""

    def forward_ops(self, local_experts: float) -> float:
        return self.forward + self.expert_gemms_forward * max(local_experts, 1.0)

    def backward_ops(self, local_experts: float) -> float:
        return self.backward + self.expert_gemms_backward * max(local_experts, 1.0)


def count_host_ops(forward: Any, backward: Any, source: str = "") -> HostOps:
    """Count the ops a captured forward and backward graph issue (fx GraphModules or Graphs).

    Views, `getitem` and collective waits issue nothing; an op trex has no formula for is counted
    (it still goes through the dispatcher).
    """
    from trex.cost_model.op_formulas import formula_for, op_name

    def count(graph: Any) -> tuple[int, int]:
        graph = getattr(graph, "graph", graph)
        ops = experts = 0
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            formula = formula_for(node.target)
            if formula is not None and formula.kind in ("view", "sync"):
                continue
            if op_name(node.target) in EXPERT_GEMM_OPS:
                experts += 1
            else:
                ops += 1
        return ops, experts

    f, fe = count(forward)
    b, be = count(backward)
    return HostOps(f, b, fe, be, source)


@cache
def _table() -> dict[str, Any]:
    return tomllib.loads(resources.files("trex.cost_model").joinpath("data", "host_ops.toml").read_text())


def host_ops_for(structure: str) -> HostOps:
    """The stored count of a layer structure, e.g. "qwen3-moe.moe" (see data/host_ops.toml)."""
    table = _table()
    if structure not in table:
        raise TrexError(
            f"no host-op count for layer structure {structure!r}; data/host_ops.toml has {', '.join(sorted(table))}"
        )
    entry = table[structure]
    return HostOps(
        int(entry["forward"]),
        int(entry["backward"]),
        int(entry.get("expert_gemms_forward", 0)),
        int(entry.get("expert_gemms_backward", 0)),
        str(entry.get("source", "")),
    )


def segment_time(host_s: float, device_s: float) -> float:
    """One stretch between host synchronisations: the slower of the host issuing it and the device running it."""
    return max(host_s, device_s)


class HostAndDeviceTimes(Protocol):
    """What `chunk_host_wait` needs of a priced layer (a `LayerCost`)."""

    host_forward_s: float
    host_backward_s: float
    syncs_host: bool

    @property
    def device_forward_s(self) -> float: ...

    @property
    def device_backward_s(self) -> float: ...


def chunk_host_wait(parts: Iterable[tuple[HostAndDeviceTimes, int]]) -> tuple[float, float]:
    """Forward and backward time the device of one pipeline chunk waits for its host, per micro-batch.

    `parts` are (priced layer, how many of it). A layer whose forward synchronises with the host is
    its own stretch, max(host, device); the rest of the forward shares one stretch, and so does the
    whole backward (nothing in it waits for the device). Pipeline sends bound the chunk: a blocking
    send synchronises anyway, and an overlapped one is waited for before the chunk's first op runs.
    """
    parts = list(parts)
    synced = sum(n * segment_time(p.host_forward_s, p.device_forward_s) for p, n in parts if p.syncs_host)
    free = segment_time(
        sum(n * p.host_forward_s for p, n in parts if not p.syncs_host),
        sum(n * p.device_forward_s for p, n in parts if not p.syncs_host),
    )
    device_forward = sum(n * p.device_forward_s for p, n in parts)
    device_backward = sum(n * p.device_backward_s for p, n in parts)
    backward = segment_time(sum(n * p.host_backward_s for p, n in parts), device_backward)
    return max(0.0, synced + free - device_forward), max(0.0, backward - device_backward)
