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
