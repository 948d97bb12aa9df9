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
from dataclasses import dataclass, field

import numpy as np

from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.latency_fit import LatencyModel, non_negative_lstsq

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


def shape_factors(
    steps: list[TimedStep], model: LatencyModel, min_steps: int = 5, scale: list[float] | None = None
) -> ShapeFactors:
    """`ShapeFactors` of one instance from its steps (a rehearsal's timeline) and its profile's model; `scale`, when
    given, multiplies the model's CPU of each step (one number per step: another factor already known for it)."""
    n = len(DECODE_BANDS)
    if scale is not None and len(scale) != len(steps):
        raise ServingError(f"{len(scale)} scale factors for {len(steps)} steps")
    cpu, predicted, count = [0.0] * (1 + 2 * n), [0.0] * (1 + 2 * n), [0] * (1 + 2 * n)
    for i, step in enumerate(steps):
        if step.kind == "decode" and step.seqs == 0:
            continue
        if step.kind == "prefill":
            cell = 0
        else:
            band = max(0, bisect.bisect_right(DECODE_BANDS, step.seqs) - 1)
            cell = 1 + band + (n if step.repacked else 0)
        cpu[cell] += step.cpu_s
        predicted[cell] += step.model_cpu_s(model) * (scale[i] if scale is not None else 1.0)
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


@dataclass(frozen=True)
class StepCpuEstimate:
    """Each instance's step CPU in service over its profile's, estimated from every step the instances ran so far.

    Two factors multiply a step's profiled CPU. One by the step's shape, per instance (`ShapeFactors`: how the
    instance's large and small batches, prefills and re-packs drift from its profile). One by how many instances
    were in a step at the time, shared by all instances on the host (`busy[k - 1]`): when more threads want the
    cores than there are, the kernel time-slices them, and a step that loses its core comes back to cold caches -
    measured on the live bench, the same worker's steps cost 0.88-0.93x its profile with one worker busy and
    1.04-1.13x with all three (bench/RESULTS.md section 8, sixth session). A rehearsal alone sees few steps of
    some cells (trex sends the slowest worker a handful of requests) and only one minute of a host whose speed
    moves by 10-25% between minutes; pooling every step since the workers started - calibration, rehearsals, earlier
    runs, all weighted alike - gives each cell its steps, and separating the busy-count factor lets steps taken
    under another scheduler's mix of busy workers inform this one's. The two factors are fitted together by
    alternating ratio estimates (each the summed CPU over the summed prediction of its cell, given the other), the
    busy factor normalised to 1 at the busy count seen most often. `overall` is each instance's summed step CPU over
    its profile's (one number: what a scheduler's latency model is scaled by).

    `shares[k - 1]` is the CPU a step gets per second of wall time while k instances are busy: the share of a core
    the simulator runs a step at (`CpuShares`, with `processor_sharing`: the share follows the busy count during the
    step). It is measured on the instances' own steps rather than on spinning probes, so it includes what the probes
    cannot see - the instances' HTTP threads, the router and the client taking their time slices (on the live bench
    the steps got 0.76-0.81 of a core with two workers busy where the probes read 0.92). A step's CPU is the sum over
    the busy counts it ran beside of share(k) x its wall time at k (`wall_by_busy`, from all the instances' steps),
    linear in the shares: they are the non-negative least-squares fit over every step (each weighted by the inverse
    of its wall time, so that with one busy count the share is the steps' total CPU over their total wall time)."""

    shapes: dict[str, ShapeFactors]
    busy: tuple[float, ...]  # k = 1..instances
    busy_steps: tuple[int, ...]  # steps measured with k instances busy
    overall: dict[str, float]
    steps: int  # steps the estimate is made of
    shares: tuple[float, ...] = ()  # k = 1..instances: the steps' CPU over their wall time (nearest measured k fills)
    # per instance, per step: (its CPU over the estimate's, its wall time over its CPU / share) - the variation around
    # the fitted means, for `Simulation(step_noise=)`
    residuals: dict = field(default_factory=dict)

    def cpu_shares(self):
        """The measured shares as the simulator's `CpuShares`."""
        from trex.workloads.serving.cpu_share import CpuShares

        return CpuShares(self.shares, f"the workers' own steps ({self.steps}), CPU over wall by busy workers")

    def simulation_options(self) -> dict:
        """`Simulation` keyword arguments that apply the estimate to each step: its CPU and its share of a core."""
        return {
            "shape_factors": dict(self.shapes),
            "cpu_factors": {name: self.busy for name in self.shapes},
            "cpu_shares": self.cpu_shares(),
            "processor_sharing": True,
        }

    def describe(self) -> str:
        busy = ", ".join(f"{k + 1}: {f:.2f} ({c})" for k, (f, c) in enumerate(zip(self.busy, self.busy_steps)))
        shares = ", ".join(f"{s:.2f}" for s in self.shares)
        return f"{self.steps} steps; CPU factor by busy instances {busy}; share of a core {shares}"


def estimate_step_cpu(
    names: list[str],
    timelines: list[list[TimedStep]],
    models: list[LatencyModel],
    min_steps: int = 5,
    max_rounds: int = 50,
) -> StepCpuEstimate:
    """`StepCpuEstimate` from the instances' timelines (every step since they started, one clock) and profiles."""
    if not len(names) == len(timelines) == len(models):
        raise ServingError(f"{len(names)} names, {len(timelines)} timelines and {len(models)} latency models")
    n = len(timelines)
    served = [[s for s in steps if not (s.kind == "decode" and s.seqs == 0)] for steps in timelines]
    counts = busy_counts(served)
    total = sum(len(steps) for steps in served)
    if any(len(steps) < min_steps for steps in served):
        raise ServingError(
            f"an instance ran fewer than {min_steps} steps ({[len(s) for s in served]}): too little to estimate from"
        )
    busy = [1.0] * n
    shapes: list[ShapeFactors] = []
    seen = [0] * n
    for _ in range(max_rounds):
        shapes = [
            shape_factors(steps, model, min_steps, [busy[k - 1] for k in ks])
            for steps, model, ks in zip(served, models, counts)
        ]
        cpu, predicted, seen = [0.0] * n, [0.0] * n, [0] * n
        for steps, model, ks, shape in zip(served, models, counts, shapes):
            for step, k in zip(steps, ks):
                cpu[k - 1] += step.cpu_s
                predicted[k - 1] += step.model_cpu_s(model) * shape.factor(step.kind, step.seqs, step.repacked)
                seen[k - 1] += 1
        measured = [k for k in range(n) if seen[k] >= min_steps and predicted[k] > 0]
        if not measured:
            break
        raw = {k: cpu[k] / predicted[k] for k in measured}
        norm = raw[max(measured, key=lambda k: (seen[k], k))]
        new = [raw[min(measured, key=lambda m: (abs(m - k), m))] / norm for k in range(n)]
        converged = max(abs(a - b) for a, b in zip(new, busy)) < 1e-6
        busy = new
        if converged:
            break
    shapes = [
        shape_factors(steps, model, min_steps, [busy[k - 1] for k in ks])
        for steps, model, ks in zip(served, models, counts)
    ]
    overall = {
        name: sum(s.cpu_s for s in steps) / max(sum(s.model_cpu_s(model) for s in steps), 1e-12)
        for name, steps, model in zip(names, served, models)
    }
    walls = wall_by_busy(served)
    rows = np.array([w for steps in walls for w in steps])
    cpus = np.array([s.cpu_s for steps in served for s in steps])
    timed = [k for k in range(n) if int((rows[:, k] > 0).sum()) >= min_steps]
    shares: tuple[float, ...] = ()
    if timed:  # rows weighted by 1 / sqrt(wall): with one busy count the fit is the total CPU over the total wall
        weight = 1.0 / np.sqrt(np.maximum(rows.sum(axis=1), 1e-12))
        fit = non_negative_lstsq(rows[:, timed] * weight[:, None], cpus * weight)
        measured_share = {k: float(f) for k, f in zip(timed, fit) if f > 0}
        if measured_share:
            shares = tuple(
                min(1.0, measured_share[min(measured_share, key=lambda m: (abs(m - k), m))]) for k in range(n)
            )
    residuals = {}
    if shares:
        for name, steps, model, ks, walls_of, shape in zip(names, served, models, counts, walls, shapes):
            pairs = []
            for step, k, row in zip(steps, ks, walls_of):
                estimated = step.model_cpu_s(model) * shape.factor(step.kind, step.seqs, step.repacked) * busy[k - 1]
                share = sum(w * shares[i] for i, w in enumerate(row)) / max(sum(row), 1e-12)  # time-weighted
                if estimated > 0 and step.cpu_s > 0 and step.end_s > step.start_s:
                    pairs.append((step.cpu_s / estimated, (step.end_s - step.start_s) * share / step.cpu_s))
            residuals[name] = tuple(pairs)
    return StepCpuEstimate(dict(zip(names, shapes)), tuple(busy), tuple(seen), overall, total, shares, residuals)


def wall_by_busy(timelines: list[list[TimedStep]]) -> list[list[list[float]]]:
    """For every step of every instance: its wall time spent while k = 1..instances instances were in a step (itself
    included), from all the instances' steps on one clock."""
    n = len(timelines)
    events = sorted((t, d) for steps in timelines for s in steps for t, d in ((s.start_s, 1), (s.end_s, -1)))
    times, busy, level = [], [], 0  # the busy count is busy[i] on [times[i], times[i + 1])
    for t, d in events:  # ends sort before starts at the same instant: back-to-back steps do not overlap
        level += d
        if times and times[-1] == t:
            busy[-1] = level
        else:
            times.append(t)
            busy.append(level)
    out = []
    for steps in timelines:
        mine = []
        for step in steps:
            row = [0.0] * n
            i = max(0, bisect.bisect_right(times, step.start_s) - 1)
            while i < len(times) and times[i] < step.end_s:
                lo = max(times[i], step.start_s)
                hi = min(times[i + 1] if i + 1 < len(times) else step.end_s, step.end_s)
                if hi > lo:
                    row[min(max(busy[i], 1), n) - 1] += hi - lo
                i += 1
            mine.append(row)
        out.append(mine)
    return out
