"""Workers' step timelines against their profiles: what a step costs while other instances run beside it.

A worker's engine logs every step it runs (`batching.BatchingEngine.step_log`, served at `GET
/trex/timeline`): kind, wall start and end, the engine thread's CPU time, sequences and context
tokens, and whether the decode step re-packed the batch cache. Its profile (`trex serve profile`)
priced the same kinds of step in the profiling process. On a host where instances share cores, a
step's *CPU time* need not be a constant of its shape: while other instances' steps run on the other
cores they share the last-level cache and the memory bandwidth (every decode step streams all the
weights), and the cores' clock may drop as more of them are busy. `cpu_factors` measures that from
the timelines themselves: for each instance and each number `k` of instances busy when its step ran
(itself included, from the other instances' overlapping steps), the CPU its steps took over the CPU
its profile predicts for the same shapes. The simulator multiplies a step's CPU by its instance's
factor for the instances busy when the step starts (`Simulation(cpu_factors=)`); `CpuShares` then
stretches CPU into wall time, a separate effect (the time slices other runnable processes take).
What the live bench measured with it (bench/RESULTS.md section 8, fourth session): on the loaded
host under the bench lock the factor moves little with `k` (0.82 -> 0.89 from one to three busy,
one worker, one run) and more with the batch size and over time, which a factor by `k` does not
capture.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.latency_fit import LatencyModel

STEP_FIELDS = ("kind", "start_s", "end_s", "cpu_s", "seqs", "context", "padded", "repacked")


@dataclass(frozen=True)
class TimedStep:
    """One step a worker ran, as its `/trex/timeline` logs it."""

    kind: str  # "prefill" | "decode"
    start_s: float
    end_s: float
    cpu_s: float
    seqs: int
    context: int  # prefill: prompt tokens; decode: tokens attended over (cache + the new one), summed
    padded: int = 0  # decode: sequences x the padded batch width
    repacked: bool = False

    @staticmethod
    def from_row(row) -> TimedStep:
        if len(row) != len(STEP_FIELDS):
            raise ServingError(f"a timeline step has the fields {STEP_FIELDS} (got {row!r})")
        kind, start, end, cpu, seqs, context, padded, repacked = row
        return TimedStep(str(kind), float(start), float(end), float(cpu), int(seqs), int(context), int(padded),
                         bool(repacked))  # fmt: skip

    def model_cpu_s(self, model: LatencyModel) -> float:
        """What `model` (a profile: CPU time, the instance alone) predicts for this step."""
        if self.kind == "prefill":
            return model.prefill_s(self.context, self.context**2)
        return model.decode_s(self.seqs, self.context) + (model.repack_s(self.context) if self.repacked else 0.0)


def busy_counts(timelines: list[list[TimedStep]]) -> list[list[int]]:
    """For every step of every instance: how many instances (itself included) were in a step at its midpoint."""
    spans = [[(s.start_s, s.end_s) for s in steps] for steps in timelines]
    counts = []
    for i, steps in enumerate(timelines):
        mine = []
        for step in steps:
            t = 0.5 * (step.start_s + step.end_s)
            busy = 1
            for j, other in enumerate(spans):
                if j != i:
                    k = bisect.bisect_right(other, (t, float("inf"))) - 1
                    busy += k >= 0 and other[k][0] <= t < other[k][1]
            mine.append(busy)
        counts.append(mine)
    return counts


def cpu_factors(
    timelines: list[list[TimedStep]], models: list[LatencyModel], min_steps: int = 10
) -> list[tuple[float, ...]]:
    """Per instance, `factors[k - 1]`: its steps' CPU while `k` instances were busy over what its profile predicts
    for them (k = 1..instances). A count seen in fewer than `min_steps` steps takes the nearest count's factor
    (the smaller on a tie); an instance with no steps at all is an error (nothing was measured)."""
    if len(timelines) != len(models):
        raise ServingError(f"{len(timelines)} timelines for {len(models)} latency models")
    n = len(timelines)
    factors = []
    for steps, model, busy in zip(timelines, models, busy_counts(timelines)):
        cpu, predicted, count = [0.0] * n, [0.0] * n, [0] * n
        for step, k in zip(steps, busy):
            if step.kind == "decode" and step.seqs == 0:
                continue
            cpu[k - 1] += step.cpu_s
            predicted[k - 1] += step.model_cpu_s(model)
            count[k - 1] += 1
        measured = [k for k in range(n) if count[k] >= min_steps and predicted[k] > 0]
        if not measured:
            raise ServingError(
                f"a timeline has {sum(count)} steps, fewer than {min_steps} at any number of busy instances: "
                "send more calibration requests"
            )
        own = {k: cpu[k] / predicted[k] for k in measured}
        factors.append(tuple(own[min(measured, key=lambda m: (abs(m - k), m))] for k in range(n)))
    return factors
