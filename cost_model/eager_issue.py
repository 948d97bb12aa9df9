"""What an eager CPU rank spends issuing its ops, beyond the kernels: counted ops times measured costs.

On a CPU rank the Python, dispatcher and autograd work of every op runs on the same core as its kernel,
one after the other. With the tiny shapes of a test run that work, not the kernels, is most of a step
(a 4-layer Qwen3-MoE micro-batch issues ~1500 ops whose kernels take microseconds each), and it scales
with what the rank issues: the micro-batches it runs, the DTensor ops of tensor parallelism (sharding
propagation, wrapping and unwrapping, the tp styles' hooks: several times a plain op), and FSDP2's
per-unit pre/post forward and backward hooks (copy-in, copy-out, resharding bookkeeping).

`IssuedOps` (in `eager_issue_measure`, with torch) counts, under a `TorchDispatchMode`, the top-level ops
a program issues (a DTensor op counts once: its local ops run beneath the mode), split into plain and
DTensor ops. `trex calibrate` measures the cost of each on this host (`measure_eager_costs`, in a process of
its own with a fake process group: no communication is timed) and stores it in the device profile
(`eager_op_us`, `dtensor_op_us`, `fsdp_unit_us`); `issue_seconds` prices a rank's counts with them.
Nothing is fitted to training runs.

This module is the pricing half and imports no torch (the estimator and the planner run without it);
`eager_issue_measure` holds the counting mode and the micro-benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class IssueCounts:
    """Ops one rank issues in one training step (all its micro-batches and the optimizer step)."""

    plain_ops: int
    dtensor_ops: int
    fsdp_unit_passes: int = 0  # FSDP2 units x micro-batches (each: pre/post forward and pre/post backward hooks)

    def to_dict(self) -> dict[str, int]:
        return {"plain_ops": self.plain_ops, "dtensor_ops": self.dtensor_ops, "fsdp_unit_passes": self.fsdp_unit_passes}


def issue_seconds(counts: IssueCounts, device: Any) -> float:
    """One rank's issue time per step on `device` (one process alone on a core; the caller scales it by the
    cluster's time share): every op's eager issue cost beyond the kernel's fixed cost (which the kernel model
    already charges), a DTensor op's extra dispatch, and FSDP2's hooks per unit and micro-batch."""
    per_op = getattr(device, "eager_op_us", 0.0)
    extra = getattr(device, "dtensor_op_us", 0.0)
    unit = getattr(device, "fsdp_unit_us", 0.0)
    total_ops = counts.plain_ops + counts.dtensor_ops
    return (total_ops * per_op + counts.dtensor_ops * extra + counts.fsdp_unit_passes * unit) * 1e-6
