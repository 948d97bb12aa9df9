"""Per-action timestamps of one rank's pipeline work: what the measured bubble is made of.

`TimedPipelineStage` is the engine's `PipelineStage` with its three compute entry points (forward,
backward - full or input-gradient only - and weight-gradient backward) wrapped in a clock; the loss
on the last stage is timed by the trainer's loss function. A rank's busy time in a step is the sum
of its intervals; the rest of the step (waiting for a neighbour's activation or gradient) is bubble.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Interval:
    kind: str  # F forward, B full backward, I input-gradient backward, W weight-gradient backward, L loss
    stage: int
    microbatch: int
    start: float
    end: float


@dataclass
class StageClock:
    intervals: list[Interval] = field(default_factory=list)

    @contextmanager
    def busy(self, kind: str, stage: int, microbatch: int) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.intervals.append(Interval(kind, stage, microbatch, start, time.perf_counter()))

    def take(self) -> list[Interval]:
        """The intervals recorded since the last call (one step's)."""
        out, self.intervals = self.intervals, []
        return out


def timed_stage(clock: StageClock, *args, **kwargs):
    """A `PipelineStage(*args, **kwargs)` whose compute actions are recorded on `clock`."""
    from torch.distributed.pipelining import PipelineStage

    class TimedPipelineStage(PipelineStage):
        def forward_one_chunk(self, fwd_chunk_id, *a, **k):
            with clock.busy("F", self.stage_index, fwd_chunk_id):
                return super().forward_one_chunk(fwd_chunk_id, *a, **k)

        def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
            with clock.busy("B" if full_backward else "I", self.stage_index, bwd_chunk_id):
                return super().backward_one_chunk(
                    bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward
                )

        def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
            with clock.busy("W", self.stage_index, bwd_chunk_id):
                return super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)

    return TimedPipelineStage(*args, **kwargs)


def busy_seconds(intervals: list[Interval]) -> float:
    return sum(i.end - i.start for i in intervals)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for one schedule step, on again after it (torchtitan runs its
    training loop with automatic collection off for the same reason). A step allocates enough autograd
    objects to trigger collections inside it; a generation-1 collection stops the rank for 15-20 ms (tiny
    models, CPU) at a random action, which its neighbours then wait for - idle time no schedule explains.
    Objects the step leaves in cycles are collected by the automatic collector after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def p2p_timed(log: list) -> Iterator[None]:
    """The engine's message posts (`_batch_p2p`) and waits (`_wait_batch_p2p`) recorded in `log` as
    ("post" / "wait", start, end) while the block runs (one schedule step). Why: the training run's
    non-compute time was longer than the calibration's null chunks measure for the same schedule (RESULTS
    14.6); with the posts and waits timed in both runs, a step's non-compute time splits into posting,
    waiting for a message (or for a send's handshake) and the rest (the runtime's own Python work), and the
    two runs can be compared part by part (`comm_split`). Every schedule of the engine posts and waits
    through these two module functions (the lowered runtime's SEND/RECV actions too)."""
    from torch.distributed.pipelining import schedules

    post, wait = schedules._batch_p2p, schedules._wait_batch_p2p

    def timed_post(ops, desc=None):
        start = time.perf_counter()
        try:
            return post(ops, desc=desc)
        finally:
            if ops:
                log.append(("post", start, time.perf_counter()))

    def timed_wait(work):
        start = time.perf_counter()
        try:
            return wait(work)
        finally:
            if work:
                log.append(("wait", start, time.perf_counter()))

    schedules._batch_p2p, schedules._wait_batch_p2p = timed_post, timed_wait
    try:
        yield
    finally:
        schedules._batch_p2p, schedules._wait_batch_p2p = post, wait


def comm_split(steps: list[tuple[float, list[Interval], list]]) -> dict[str, float]:
    """One rank's steps, each (step seconds, compute intervals, `p2p_timed` log), as the mean milliseconds per
    step spent computing, posting messages, waiting on them (`long_waits`: waits over 0.1 ms, their count per
    step) and elsewhere (`other`: the runtime's work between actions: bookkeeping, autograd and activation
    release outside the timed passes)."""
    if not steps:
        return {}
    n = len(steps)
    compute = sum(busy_seconds(intervals) for _, intervals, _ in steps) / n
    posting = sum(end - start for _, _, log in steps for what, start, end in log if what == "post") / n
    waits = [end - start for _, _, log in steps for what, start, end in log if what == "wait"]
    step = sum(seconds for seconds, _, _ in steps) / n
    return {
        "step_ms": step * 1e3,
        "compute_ms": compute * 1e3,
        "post_ms": posting * 1e3,
        "wait_ms": sum(waits) / n * 1e3,
        "long_waits": sum(w > 1e-4 for w in waits) / n,
        "other_ms": (step - compute - posting - sum(waits) / n) * 1e3,
    }
