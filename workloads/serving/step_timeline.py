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


DECODE_BANDS = (1, 2, 4, 8)  # lower edges of the decode batch-size bands: 1, 2-3, 4-7, 8 and more


@dataclass(frozen=True)
class ShapeFactors:
    """One instance's step CPU over what its profile predicts, by the step's shape, measured in service.

    Why by shape: on a shared host a step's CPU time is not a constant of its shape - it depends on what
    runs on the other cores at the time (shared caches and memory bandwidth, and on a virtual machine the
    host's other tenants on the same physical core), and the dependence grows with the step's working set:
    live decode steps of large batches (and their re-packs) cost up to 1.6x the profile while steps of one
    sequence cost 0.8-1.2x (bench/RESULTS.md section 8, fourth session). A rehearsal under the run's own
    scheduler and rate, right before it, puts the workers in the same state as the run; the factor of each
    cell (prefill; decode by batch-size band, plain or after a re-pack) is its steps' summed CPU over the
    profile's for the same steps. A cell with fewer than `min_steps` steps takes the nearest measured band of
    its kind (then the other kind's, then the instance's overall factor)."""

    prefill: float
    decode: tuple[float, ...]  # per band of DECODE_BANDS: decode steps that did not re-pack
    repacked: tuple[float, ...]  # per band: decode steps after a join or leave (the re-pack included)
    counts: tuple[int, ...] = ()  # steps measured: prefill, then the decode bands, then the re-packed bands
    bands: tuple[int, ...] = DECODE_BANDS

    def __post_init__(self):
        values = (self.prefill, *self.decode, *self.repacked)
        if len(self.decode) != len(self.bands) or len(self.repacked) != len(self.bands):
            raise ServingError(f"shape factors need one decode and one re-packed factor per band {self.bands}")
        if any(not 0 < v < float("inf") for v in values):
            raise ServingError(f"shape factors must be positive finite numbers (got {values})")

    def band(self, seqs: int) -> int:
        return max(0, bisect.bisect_right(self.bands, seqs) - 1)

    def factor(self, kind: str, seqs: int, repacked: bool) -> float:
        if kind == "prefill":
            return self.prefill
        return (self.repacked if repacked else self.decode)[self.band(seqs)]

    def describe(self) -> str:
        names = []
        for i, lo in enumerate(self.bands):
            hi = self.bands[i + 1] - 1 if i + 1 < len(self.bands) else None
            names.append(f"B{lo}+" if hi is None else f"B{lo}" if hi == lo else f"B{lo}-{hi}")
        counts = self.counts or (0,) * (1 + 2 * len(self.bands))
        n = len(self.bands)
        return (
            f"prefill {self.prefill:.2f} ({counts[0]})"
            + "".join(f", {b} {f:.2f} ({c})" for b, f, c in zip(names, self.decode, counts[1 : 1 + n]))
            + "".join(f", {b} re-packed {f:.2f} ({c})" for b, f, c in zip(names, self.repacked, counts[1 + n :]))
        )


def shape_factors(steps: list[TimedStep], model: LatencyModel, min_steps: int = 5) -> ShapeFactors:
    """`ShapeFactors` of one instance from its steps (a rehearsal's timeline) and its profile's model."""
    n = len(DECODE_BANDS)
    cpu, predicted, count = [0.0] * (1 + 2 * n), [0.0] * (1 + 2 * n), [0] * (1 + 2 * n)
    for step in steps:
        if step.kind == "decode" and step.seqs == 0:
            continue
        if step.kind == "prefill":
            cell = 0
        else:
            band = max(0, bisect.bisect_right(DECODE_BANDS, step.seqs) - 1)
            cell = 1 + band + (n if step.repacked else 0)
        cpu[cell] += step.cpu_s
        predicted[cell] += step.model_cpu_s(model)
        count[cell] += 1
    if sum(count) < min_steps or sum(predicted) <= 0:
        raise ServingError(
            f"a rehearsal timeline has {sum(count)} steps, fewer than {min_steps}: send more rehearsal requests"
        )
    overall = sum(cpu) / sum(predicted)
    measured = {c: cpu[c] / predicted[c] for c in range(1 + 2 * n) if count[c] >= min_steps and predicted[c] > 0}

    def nearest(offset: int, band: int) -> float | None:
        found = [b for b in range(n) if offset + b in measured]
        if not found:
            return None
        return measured[offset + min(found, key=lambda b: (abs(b - band), b))]

    def decode_cell(repacked: bool, band: int) -> float:
        own, other = (1 + n, 1) if repacked else (1, 1 + n)
        for offset in (own, other):
            value = nearest(offset, band)
            if value is not None:
                return value
        return overall

    return ShapeFactors(
        measured.get(0, overall),
        tuple(decode_cell(False, b) for b in range(n)),
        tuple(decode_cell(True, b) for b in range(n)),
        tuple(count),
    )
