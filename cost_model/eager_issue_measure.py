"""The counting and the measuring half of `eager_issue`: `IssuedOps` (a `TorchDispatchMode` that counts the
plain and DTensor ops a program issues) and the micro-benchmarks `trex calibrate` runs to price them.

Kept apart from `eager_issue` because it needs torch, which the estimator and the planner must not import.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trex.cost_model.eager_issue import IssueCounts


class IssuedOps(TorchDispatchMode):
    """Counts the top-level ops dispatched while active: plain ones, and those with a DTensor operand (DTensor's
    own local ops run under the mode's handler and are not seen: one DTensor op is one count)."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = 0
        self.dtensor = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            self.dtensor += 1
        else:
            self.plain += 1
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------------------------------------
# The calibration's micro-benchmarks (run by `trex calibrate` in a process of its own)


class _Block(torch.nn.Module):
    """A transformer MLP sub-block (norm, gated MLP, residual) at tiny width: its kernels take about a
    microsecond each, so its eager time is what issuing its ops costs."""

    def __init__(self, hidden: int = 16, inner: int = 32):
        super().__init__()
        self.norm = torch.nn.RMSNorm(hidden)
        self.gate_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.down_proj = torch.nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


def _timed_pass(model: torch.nn.Module, make_input: Any, repeats: int, inner: int = 20) -> tuple[float, IssueCounts]:
    """(best seconds of one forward+backward, the ops it issues)."""

    def once() -> None:
        out = model(make_input())
        out = out.to_local() if hasattr(out, "to_local") else out
        out.sum().backward()

    for _ in range(3):
        once()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            once()
        best = min(best, (time.perf_counter() - start) / inner)
    with IssuedOps() as mode:
        once()
    return best, IssueCounts(mode.plain, mode.dtensor)


def measure_eager_costs(repeats: int = 7, ranks: int = 2) -> dict[str, float]:
    """{"eager_op_us", "dtensor_op_us", "fsdp_unit_us", and the counts and times behind them} on this host, one
    thread, in THIS process, which must have no process group: a fake one of `ranks` ranks is created (DTensor
    and FSDP2 run their full host-side logic; the fake group moves no data, so no communication is timed).

    eager_op_us: a tiny MLP block's forward+backward time per op issued, less the kernel's fixed cost per call
    (measured as the intercept of an element-wise add: the kernel model charges that part).
    dtensor_op_us: the same block under the runtime's tensor-parallel styles (sequence-parallel norm,
    column-parallel gate/up, row-parallel down with a sequence-sharded output), the time beyond its ops at the
    eager cost, per DTensor op. fsdp_unit_us: four blocks each `fully_shard`ed plus the root, the time beyond
    their ops at the eager cost, per unit and forward+backward."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers the "fake" backend
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if dist.is_initialized():
        raise RuntimeError("measure_eager_costs needs a process without a process group (run it in its own)")
    torch.manual_seed(0)
    tokens, hidden = 8, 16
    x = torch.randn(1, tokens, hidden)
    fixed_us = _fixed_kernel_us(repeats)
    plain_s, plain = _timed_pass(_Block(hidden), lambda: x, repeats)
    per_op_s = plain_s / max(1, plain.plain_ops)
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=ranks)
    try:
        mesh = init_device_mesh("cpu", (ranks,))
        tp_block = _Block(hidden)
        parallelize_module(
            tp_block,
            mesh,
            {
                "norm": SequenceParallel(),
                "gate_proj": ColwiseParallel(input_layouts=Shard(1)),
                "up_proj": ColwiseParallel(input_layouts=Shard(1)),
                "down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            },
        )
        # the residual stream is a sequence-sharded DTensor, as in the runtime's decoder layers
        parallelize_module(
            tp_block,
            mesh,
            PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=False),
        )
        local = x[:, : tokens // ranks].contiguous()
        tp_s, tp = _timed_pass(tp_block, lambda: local, repeats)
        dtensor_s = max(0.0, tp_s - (tp.plain_ops + tp.dtensor_ops) * per_op_s) / max(1, tp.dtensor_ops)

        units = 4
        sharded = torch.nn.Sequential(*(_Block(hidden) for _ in range(units)))
        reference = torch.nn.Sequential(*(_Block(hidden) for _ in range(units)))
        for block in sharded:
            fully_shard(block, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        fsdp_s, fsdp = _timed_pass(sharded, lambda: x, repeats)
        reference_s, reference_counts = _timed_pass(reference, lambda: x, repeats)
        issued = fsdp.plain_ops * per_op_s + fsdp.dtensor_ops * (per_op_s + dtensor_s)
        unit_s = max(0.0, fsdp_s - issued) / (units + 1)
    finally:
        dist.destroy_process_group()
    return {
        "eager_op_us": max(0.0, per_op_s * 1e6 - fixed_us),
        "dtensor_op_us": dtensor_s * 1e6,
        "fsdp_unit_us": unit_s * 1e6,
        "kernel_fixed_us": fixed_us,
        "block_ops": plain.plain_ops,
        "block_us": plain_s * 1e6,
        "tp_block_ops": (tp.plain_ops, tp.dtensor_ops),
        "tp_block_us": tp_s * 1e6,
        "fsdp_ops": (fsdp.plain_ops, fsdp.dtensor_ops),
        "fsdp_us": fsdp_s * 1e6,
        "unsharded_us": reference_s * 1e6,
        "unsharded_ops": reference_counts.plain_ops,
    }


def _fixed_kernel_us(repeats: int) -> float:
    """The fixed cost of one small kernel called directly (an element-wise add of 4 elements): the part of an op
    the kernel model charges (`op_overhead_us`), taken out of the eager per-op cost."""
    a, b, out = torch.rand(4), torch.rand(4), torch.empty(4)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(2000):
            torch.add(a, b, out=out)
        best = min(best, (time.perf_counter() - start) / 2000)
    return best * 1e6


def _measure_on_one_thread(repeats: int, ranks: int) -> dict[str, float]:
    torch.set_num_threads(1)  # as the ranks run (OMP_NUM_THREADS=1)
    return measure_eager_costs(repeats, ranks)


def measure_eager_costs_apart(repeats: int = 7, ranks: int = 2, timeout: float = 300.0) -> dict[str, Any]:
    """`measure_eager_costs` in a spawned process (its fake process group never touches the caller's); a dict
    with "error" when it could not be measured (the calibration then says what was not measured)."""
    answer = answer_apart(_measure_on_one_thread, (repeats, ranks), timeout)
    return answer if answer is not None else {"error": "the measuring process ended without an answer"}


def _answering(fn: Any, args: tuple, queue: Any) -> None:
    try:
        queue.put(fn(*args))
    except Exception as error:  # sent to the caller, which says what was left out and why
        queue.put({"error": f"{type(error).__name__}: {error}"})


def answer_apart(fn: Any, args: tuple, timeout_s: float) -> dict[str, Any] | None:
    """`fn(*args)` (a module-level function returning a dict) in a spawned process, so that a fake process
    group or torch state it sets up never touches the caller's. Its dict; {"error": ...} when it raised; None
    when the process died without answering or ran past `timeout_s` (a dead process is not waited out)."""
    import multiprocessing
    import queue as queues

    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    process = context.Process(target=_answering, args=(fn, args, answers))
    process.start()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return answers.get(timeout=1.0)
            except queues.Empty:
                if not process.is_alive():
                    try:
                        return answers.get(timeout=1.0)
                    except queues.Empty:
                        return None
        return None
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.terminate()
