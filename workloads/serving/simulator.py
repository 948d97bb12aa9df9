"""Discrete-event simulation of a heterogeneous deployment: continuous batching under KV-cache limits.

Each instance runs the loop of a vLLM-style engine, one step at a time, each step priced by the
instance's fitted `LatencyModel`:

* a prefill step when waiting requests can be admitted: FCFS, up to `max_batched_tokens` prompt
  tokens (a longer prompt runs alone), `max_prefill_seqs` prompts (when set), `max_num_seqs`
  sequences and the KV cache's free bytes;
  every admitted request gets its first token at the end of the step;
* otherwise a decode step: every running sequence gains one token (plus, when sequences joined or
  left since the last one, the re-pack of the batch's cache the instance's `LatencyModel.repack`
  prices: the local CPU worker's left-padded cache; zero for a paged one). Before the step the KV cache
  must hold each sequence's next token; when it cannot, the most recently admitted sequence is
  preempted (its cache freed, re-queued at the head to be recomputed), as vLLM does.

Requests arrive at their trace times and are dispatched on arrival by a `Scheduler` that sees the
instances' live `InstanceLoad`s. A request that no instance's KV cache could ever hold is dropped
with the reason; so is one that finds its instance's queue at `max_waiting` (backpressure).
Instances that share one host's CPU cores (the local CPU workers of the live bench, one thread
each) run their steps slower while others are busy: given the host's `cpu_shares`
(`cpu_share.CpuShares`: the fraction of a core each of k busy instances gets, measured on a shared
host, or `shared_cores=C` for an idle one: min(1, C / k)), a step starting while k instances are busy
takes its profiled CPU time divided by that share (times `share_over_time(now)` when given: a
host whose other load moved during the run, measured afterwards). With `processor_sharing=True` the
share follows the busy count *during* the step, as the kernel's scheduler does: whenever an instance
starts or ends a step, every step in flight runs on at the share of the new count (a long step of a
slow instance that began beside two busy instances speeds up when they go idle). The CPU a step takes may itself depend on
how many instances are busy beside it (`cpu_factors`, measured from the workers' step timelines by
`step_timeline.cpu_factors`: shared cache and memory bandwidth, the cores' clock), and on its shape
(`shape_factors`: per instance, a step's CPU in service over its profile's by kind and batch size,
measured in a rehearsal under the same scheduler and rate: `step_timeline.shape_factors`). After
the last arrival the run drains for at most `drain_s`; what is still in flight then is reported as
unfinished. Every request ends in exactly one of: completed, dropped, unfinished.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field

from trex.workloads.serving.capacity import SLO
from trex.workloads.serving.cpu_share import CpuShares
from trex.workloads.serving.deployment import InstanceSpec
from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.metrics import RequestRecord, ServingReport, summarise
from trex.workloads.serving.schedulers import InstanceLoad, RequestInfo, Scheduler
from trex.workloads.serving.workload import Request


@dataclass
class _Sequence:
    request: Request
    expected_output: int
    to_prefill: int  # prompt tokens (plus generated ones after a preemption: recomputed)
    generated: int = 0
    first_token_s: float | None = None
    preemptions: int = 0
    kv_next: float = 0.0  # KV bytes once the next token is added

    @property
    def context(self) -> int:
        return self.request.prompt_tokens + self.generated


@dataclass
class _Instance:
    spec: InstanceSpec
    load: InstanceLoad
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    busy: bool = False
    busy_s: float = 0.0
    step: tuple = ()  # ("prefill", sequences) or ("decode", sequences) in flight
    kv_next: float = 0.0  # sum of the running sequences' kv_next
    context: int = 0  # tokens held by the running sequences
    stale: bool = True  # the load needs a refresh before the scheduler reads it
    repack_due: bool = False  # sequences joined or left since the last decode step (see LatencyModel.repack)
    # processor sharing (`Simulation(processor_sharing=True)`): the step in flight's CPU still to run, when that was
    # last brought up to date, the share of a core it runs at since, and which of its scheduled ends is current
    remaining_cpu: float = 0.0
    updated_s: float = 0.0
    rate: float = 0.0
    version: int = 0
    step_start_s: float = 0.0
    step_index: int = -1

    def refresh(self) -> None:
        """Rebuild the scheduler-visible load from the queues (expected, not true, remaining output)."""
        load = self.load
        load.waiting = len(self.waiting)
        load.waiting_prompt_tokens = sum(s.to_prefill for s in self.waiting)
        load.waiting_pairs = sum(s.to_prefill**2 for s in self.waiting)
        load.running = len(self.running)
        load.running_context_tokens = sum(s.context for s in self.running)
        load.remaining_output_tokens = sum(
            max(s.expected_output - s.generated, 1) for s in (*self.waiting, *self.running)
        )
        load.kv_used_bytes = self.kv_next  # what the running sequences hold once their next token lands
        self.stale = False


@dataclass(frozen=True)
class SimulationResult:
    report: ServingReport
    records: list[RequestRecord]
    scheduler: str
    instances: list[str]
    busy_s: dict[str, float] = field(default_factory=dict)  # per instance: wall time in steps
    cpu_s: dict[str, float] = field(default_factory=dict)  # per instance: the same steps' CPU time
    # every step: (instance, kind, start, end, cpu, sequences, context tokens, re-packed) - the timeline a live
    # run's workers log (`/trex/timeline`), to compare step by step
    steps: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"scheduler": self.scheduler, "instances": self.instances, **self.report.to_dict()}


class Simulation:
    def __init__(
        self,
        instances: list[InstanceSpec],
        scheduler: Scheduler,
        slo: SLO,
        *,
        max_waiting: int | None = None,
        drain_s: float = 3600.0,
        expected_output: int | None = None,
        shared_cores: int | None = None,
        cpu_shares: CpuShares | None = None,
        share_over_time=None,
        cpu_factors: dict[str, tuple[float, ...]] | None = None,
        shape_factors: dict | None = None,
        processor_sharing: bool = False,
        step_noise: dict | None = None,
        noise_seed: int = 0,
    ):
        if not instances:
            raise ServingError("the deployment has no instances to simulate")
        names = [spec.name for spec in instances]
        if len(set(names)) != len(names):
            raise ServingError(f"instance names must be distinct (got {names})")
        self.instances = [_Instance(spec, InstanceLoad(spec)) for spec in instances]
        self.scheduler, self.slo = scheduler, slo
        if shared_cores is not None and shared_cores < 1:
            raise ServingError(f"shared_cores must be at least 1 (got {shared_cores})")
        if shared_cores is not None and cpu_shares is not None:
            raise ServingError("give shared_cores (an idle host) or cpu_shares (a measured one), not both")
        if shared_cores is not None:
            cpu_shares = CpuShares.from_cores(shared_cores, len(instances))
        if share_over_time is not None and cpu_shares is None:
            raise ServingError("share_over_time scales cpu_shares: give cpu_shares (or shared_cores) too")
        self.max_waiting, self.drain_s, self.cpu_shares = max_waiting, drain_s, cpu_shares
        # per instance: its steps' CPU over its profile's with k instances busy (`step_timeline.cpu_factors`)
        self.cpu_factors = dict(cpu_factors or {})
        unknown = sorted(set(self.cpu_factors) - set(names))
        if unknown:
            raise ServingError(f"cpu_factors name instances that are not in the deployment: {unknown}")
        for name, factors in self.cpu_factors.items():
            if not factors or any(not 0 < f < float("inf") for f in factors):
                raise ServingError(f"{name}'s cpu_factors must be positive finite numbers (got {factors})")
        # per instance: its steps' CPU over its profile's by the step's shape, measured in a rehearsal under the
        # same scheduler and rate (`step_timeline.ShapeFactors`: anything with `factor(kind, seqs, repacked)`)
        self.shape_factors = dict(shape_factors or {})
        unknown = sorted(set(self.shape_factors) - set(names))
        if unknown:
            raise ServingError(f"shape_factors name instances that are not in the deployment: {unknown}")
        # a host whose other load changes during the run: the shares times share_over_time(now)
        self.share_over_time = share_over_time
        if processor_sharing and cpu_shares is None:
            raise ServingError("processor_sharing shares the host's cores: give cpu_shares (or shared_cores) too")
        self.processor_sharing = processor_sharing
        # per instance: (CPU, wall) residuals measured on its steps (`StepCpuEstimate.residuals`): each simulated step
        # draws one pair, its CPU scaled by the first and its time on the core by both - the steps' variation around
        # the fitted means, which a queue near saturation turns into waiting (means alone leave it out)
        self.step_noise = {name: list(pairs) for name, pairs in (step_noise or {}).items()}
        unknown = sorted(set(self.step_noise) - set(names))
        if unknown:
            raise ServingError(f"step_noise names instances that are not in the deployment: {unknown}")
        for name, pairs in self.step_noise.items():
            if not pairs or any(len(p) != 2 or not all(0 < x < float("inf") for x in p) for p in pairs):
                raise ServingError(f"{name}'s step_noise must be (CPU, wall) pairs of positive finite residuals")
        self.noise = random.Random(noise_seed)
        self.cpu_s = {spec.name: 0.0 for spec in instances}  # the steps' CPU time before contention
        self.steps: list = []
        self.expected_output = expected_output or int(scheduler.mean_output)
        self.events: list = []
        self.order = 0
        self.records: dict[int, RequestRecord] = {}
        self.last_arrival = 0.0
        self.tokens_while_arriving = 0  # output tokens generated up to the last arrival

    def _push(self, time: float, kind: str, payload) -> None:
        self.order += 1
        heapq.heappush(self.events, (time, self.order, kind, payload))

    # -- dispatch ---------------------------------------------------------------------------------
    def _arrive(self, now: float, request: Request) -> None:
        fits = [inst.spec.kv.bytes_for(request.total_tokens) <= inst.spec.kv_capacity_bytes for inst in self.instances]
        if not any(fits):
            largest = max(inst.spec.kv_capacity_bytes for inst in self.instances)
            self._drop(
                request,
                f"{request.total_tokens} tokens need more KV cache than any instance has ({largest / 2**30:.1f} GiB)",
            )
            return
        for inst in self.instances:
            if inst.stale:
                inst.refresh()
        saved = [inst.load.healthy for inst in self.instances]
        for inst, ok in zip(self.instances, fits):
            inst.load.healthy = inst.load.healthy and ok
        try:
            index = self.scheduler.choose(
                RequestInfo(request.prompt_tokens, self.expected_output), [i.load for i in self.instances]
            )
        finally:
            for inst, ok in zip(self.instances, saved):
                inst.load.healthy = ok
        inst = self.instances[index]
        if self.max_waiting is not None and len(inst.waiting) >= self.max_waiting:
            self._drop(request, f"{inst.spec.name}'s queue is full ({self.max_waiting} waiting)", inst.spec.name)
            return
        inst.load.assigned += 1
        inst.waiting.append(_Sequence(request, self.expected_output, request.prompt_tokens))
        inst.stale = True
        if not inst.busy:
            self._start_step(now, inst)

    def _drop(self, request: Request, reason: str, instance: str = "") -> None:
        self.records[request.id] = RequestRecord(
            request.id, instance, request.arrival_s, request.prompt_tokens, 0, status="dropped", reason=reason
        )

    # -- the engine loop ----------------------------------------------------------------------------
    def _admit(self, inst: _Instance) -> list[_Sequence]:
        spec = inst.spec
        free = spec.kv_capacity_bytes - inst.kv_next
        batch, tokens = [], 0
        while inst.waiting and len(inst.running) + len(batch) < spec.limits.max_num_seqs:
            head = inst.waiting[0]
            need = spec.kv.bytes_for(head.context + 1)
            if need > free or (batch and tokens + head.to_prefill > spec.limits.max_batched_tokens):
                break
            if 0 < spec.limits.max_prefill_seqs <= len(batch):
                break
            batch.append(inst.waiting.popleft())
            free -= need
            tokens += head.to_prefill
        return batch

    def _join(self, inst: _Instance, seq: _Sequence) -> None:
        seq.kv_next = inst.spec.kv.bytes_for(seq.context + 1)
        inst.repack_due = True
        inst.running.append(seq)
        inst.kv_next += seq.kv_next
        inst.context += seq.context

    def _leave(self, inst: _Instance, seq: _Sequence) -> None:
        inst.repack_due = True
        inst.running.remove(seq)
        inst.kv_next -= seq.kv_next
        inst.context -= seq.context

    def _start_step(self, now: float, inst: _Instance) -> None:
        inst.stale = True
        repacked = False
        batch = self._admit(inst)
        if batch:
            seconds = inst.spec.latency.prefill_lengths_s([s.to_prefill for s in batch])
            for seq in batch:
                self._join(inst, seq)
            inst.step = ("prefill", batch)
        elif inst.running:
            while len(inst.running) > 1 and inst.kv_next > inst.spec.kv_capacity_bytes:
                victim = inst.running[-1]
                self._leave(inst, victim)
                victim.preemptions += 1
                victim.to_prefill = victim.context
                inst.waiting.appendleft(victim)
            seconds = inst.spec.latency.decode_s(len(inst.running), inst.context)
            repacked = inst.repack_due
            if inst.repack_due:  # the engine re-packs its batch cache before the step (zero for a paged cache)
                seconds += inst.spec.latency.repack_s(inst.context)
                inst.repack_due = False
            inst.step = ("decode", list(inst.running))
        else:
            inst.busy = False
            if self.processor_sharing:
                self._reshare(now)
            return
        kind, sequences = inst.step
        busy = 1 + sum(other.busy for other in self.instances if other is not inst)
        factors = self.cpu_factors.get(inst.spec.name)
        if factors:  # the step's CPU beside `busy - 1` other busy instances: shared cache, memory bandwidth, clock
            seconds *= factors[min(busy, len(factors)) - 1]
        by_shape = self.shape_factors.get(inst.spec.name)
        if by_shape is not None:  # the step's CPU in service, by its kind and batch size (rehearsal-measured)
            seconds *= by_shape.factor(kind, len(sequences), repacked)
        noise = self.step_noise.get(inst.spec.name)
        stretch = 1.0
        if noise:
            cpu_residual, stretch = noise[self.noise.randrange(len(noise))]
            seconds *= cpu_residual
        cpu = seconds
        self.cpu_s[inst.spec.name] += seconds
        seconds *= stretch  # from here on: the step's time on the core (its CPU over its share, as measured)
        context = sum(s.to_prefill for s in sequences) if kind == "prefill" else inst.context
        if self.processor_sharing:  # the share follows the busy count during the step: `_reshare`
            inst.busy = True
            inst.remaining_cpu, inst.updated_s, inst.rate, inst.step_start_s = seconds, now, 0.0, now
            inst.step_index = len(self.steps)
            self.steps.append((inst.spec.name, kind, now, now, cpu, len(sequences), context, repacked))
            self._reshare(now)
            return
        if self.cpu_shares is not None:  # instances co-located on a host share its cores
            share = self.cpu_shares.share(busy)
            if self.share_over_time is not None:
                share = min(1.0, share * self.share_over_time(now))
            seconds /= share
        inst.busy = True
        inst.busy_s += seconds
        self.steps.append((inst.spec.name, kind, now, now + seconds, cpu, len(sequences), context, repacked))
        inst.version += 1
        self._push(now + seconds, "step", (inst, inst.version))

    def _reshare(self, now: float) -> None:
        """Processor sharing: bring every step in flight up to `now` at the share it ran at, then run each on at the
        share of the instances busy from now on, and schedule its end (earlier scheduled ends go stale)."""
        busy = [inst for inst in self.instances if inst.busy]
        share = self.cpu_shares.share(len(busy))
        if self.share_over_time is not None:
            share = min(1.0, share * self.share_over_time(now))
        for inst in busy:
            inst.remaining_cpu = max(0.0, inst.remaining_cpu - (now - inst.updated_s) * inst.rate)
            inst.updated_s, inst.rate = now, share
            inst.version += 1
            self._push(now + inst.remaining_cpu / share, "step", (inst, inst.version))

    def _finish_step(self, now: float, inst: _Instance) -> None:
        if self.processor_sharing:  # the step's wall time is known only now
            inst.busy_s += now - inst.step_start_s
            self.steps[inst.step_index] = self.steps[inst.step_index][:3] + (now,) + self.steps[inst.step_index][4:]
        _, sequences = inst.step
        kv = inst.spec.kv
        if now <= self.last_arrival:
            self.tokens_while_arriving += len(sequences)
        for seq in sequences:
            seq.generated += 1
            inst.context += 1
            if seq.first_token_s is None:
                seq.first_token_s = now
            if seq.generated >= seq.request.output_tokens:
                self._leave(inst, seq)
                r = seq.request
                self.records[r.id] = RequestRecord(
                    r.id,
                    inst.spec.name,
                    r.arrival_s,
                    r.prompt_tokens,
                    seq.generated,
                    seq.first_token_s,
                    now,
                    preemptions=seq.preemptions,
                )
            else:
                grown = kv.bytes_for(seq.context + 1)
                inst.kv_next += grown - seq.kv_next
                seq.kv_next = grown
        self._start_step(now, inst)

    def run(self, requests: list[Request]) -> SimulationResult:
        if not requests:
            raise ServingError("no requests to simulate")
        for request in requests:
            self._push(request.arrival_s, "arrive", request)
        self.last_arrival = max(r.arrival_s for r in requests)
        deadline = self.last_arrival + self.drain_s
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            if now > deadline:
                break
            if kind == "arrive":
                self._arrive(now, payload)
            elif payload[1] == payload[0].version:  # a step's end that a later re-share has not superseded
                self._finish_step(now, payload[0])
        for inst in self.instances:
            for seq in (*inst.waiting, *inst.running):
                r = seq.request
                self.records[r.id] = RequestRecord(
                    r.id,
                    inst.spec.name,
                    r.arrival_s,
                    r.prompt_tokens,
                    seq.generated,
                    seq.first_token_s,
                    None,
                    status="unfinished",
                    reason=f"still in flight {self.drain_s:g} s after the last arrival",
                    preemptions=seq.preemptions,
                )
        records = [self.records[r.id] for r in requests]
        busy = {inst.spec.name: inst.busy_s for inst in self.instances}
        start = min(r.arrival_s for r in requests)
        span = self.last_arrival - start
        steady = self.tokens_while_arriving / span if span > 0 else float("nan")
        report = summarise(records, self.slo, busy, start, steady)
        names = [i.spec.name for i in self.instances]
        return SimulationResult(report, records, self.scheduler.name, names, busy, dict(self.cpu_s), self.steps)


def simulate(
    instances: list[InstanceSpec], scheduler: Scheduler, requests: list[Request], slo: SLO, **options
) -> SimulationResult:
    return Simulation(instances, scheduler, slo, **options).run(requests)
