"""Request schedulers behind one interface, shared by the simulator and the live router.

A scheduler sees one `InstanceLoad` per instance (what is queued and running there, its KV-cache
use, its fitted latency model, whether it is healthy) and picks one for the next request. The
simulator keeps the loads exact; the router keeps them from what it dispatched and what came back.

Baselines (the ones production routers ship; see vLLM production-stack and the SGLang router):
`round_robin`, `random`, `jsq` (fewest requests in flight), `token_jsq` (fewest outstanding tokens),
`po2` (power of two choices: the less loaded of two sampled instances), `weighted_rr` (interleaved
weighted round robin on capacity: load += work / capacity, Helix ASPLOS'25's capacity-aware
primitive). `trex` is the capacity- and KV-aware scheduler of arXiv 2504.15303's design: from each
instance's fitted latencies and live state it knows how many sequences the instance can batch
while meeting the TPOT SLO and fitting its KV cache, predicts the request's TTFT there, and sends
it where its in-flight work, scaled by that capacity, drains soonest while meeting the TTFT SLO.
"""

from __future__ import annotations

import math
import random as random_module
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from trex.errors import UnknownNameError
from trex.workloads.serving.capacity import SLO
from trex.workloads.serving.deployment import InstanceSpec
from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.workload import WorkloadStats


@dataclass(frozen=True)
class RequestInfo:
    """What a scheduler knows of a request: its prompt and the output it expects (max_tokens or a mean)."""

    prompt_tokens: int
    expected_output_tokens: int


@dataclass
class InstanceLoad:
    """Live state of one instance, as its owner (simulator or router) tracks it."""

    spec: InstanceSpec
    healthy: bool = True
    waiting: int = 0  # dispatched, prefill not done
    waiting_prompt_tokens: int = 0
    waiting_pairs: int = 0  # sum of prompt_len^2 of the waiting requests
    running: int = 0  # in decode
    running_context_tokens: int = 0
    remaining_output_tokens: int = 0  # expected decode tokens left over waiting + running requests
    kv_used_bytes: float = 0.0
    assigned: int = 0  # requests ever dispatched here

    @property
    def in_flight(self) -> int:
        return self.waiting + self.running

    @property
    def outstanding_tokens(self) -> int:
        return self.waiting_prompt_tokens + self.remaining_output_tokens

    def dispatch(self, request: RequestInfo) -> None:
        self.waiting += 1
        self.waiting_prompt_tokens += request.prompt_tokens
        self.waiting_pairs += request.prompt_tokens**2
        self.remaining_output_tokens += request.expected_output_tokens
        self.assigned += 1


def kv_slots(spec: InstanceSpec, context: float) -> int:
    """Sequences of `context` tokens the instance's KV cache holds, capped by max_num_seqs (an
    unknown cache - a remote worker's - is capped by max_num_seqs only)."""
    if math.isinf(spec.kv_capacity_bytes):
        return spec.limits.max_num_seqs
    fits = int(spec.kv_capacity_bytes // max(spec.kv.bytes_for(int(context)), 1.0))
    return max(1, min(spec.limits.max_num_seqs, fits))


def capacity_requests_s(spec: InstanceSpec, mean_prompt: float, mean_output: float, mean_context: float) -> float:
    """Requests/s an instance sustains at its largest batch (KV-cache and max_num_seqs bound, no SLO)."""
    context = int(mean_context)
    batch = kv_slots(spec, context)
    per_step = spec.limits.prompts_per_prefill(mean_prompt)
    a0, a1, a2 = spec.latency.prefill
    prefill = a0 / per_step + a1 * mean_prompt + a2 * mean_prompt**2
    return batch / (mean_output * spec.latency.decode_s(batch, batch * context) + batch * prefill)


def rate_at_round_robin_utilisation(capacities_req_s: Sequence[float], utilisation: float) -> float:
    """The Poisson rate (requests/s) at which round robin, which gives each of the N instances 1/N of the requests,
    drives the slowest instance at `utilisation` of its capacity (`capacities_req_s`: each instance's, e.g.
    `capacity_requests_s` times the share of a core it gets). Why an operating point is chosen this way: an
    instance's latency under continuous batching is L b0 / (1 - rho) for rho = its offered work over its capacity
    (the batch grows until the step keeps up), so a relative error e in the forecast of its speed becomes about
    e / (1 - rho) in its latencies; bounding the slowest instance's rho bounds how far a forecast error is amplified,
    for round robin (which loads it most) and for every scheduler that loads it less."""
    if not 0.0 < utilisation < 1.0:
        raise ServingError(
            f"the slowest instance's utilisation under round robin must lie in (0, 1) (got {utilisation}); "
            "at 1 or above its queue grows without bound"
        )
    if not capacities_req_s or min(capacities_req_s) <= 0.0:
        raise ServingError(f"every instance needs a positive capacity (got {list(capacities_req_s)})")
    return utilisation * len(capacities_req_s) * min(capacities_req_s)


class Scheduler(ABC):
    name: str = ""

    def __init__(
        self, seed: int = 0, mean_prompt: float = 256.0, mean_output: float = 256.0, mean_context: float | None = None
    ):
        self.rng = random_module.Random(seed)
        self.mean_prompt, self.mean_output = mean_prompt, mean_output
        self.mean_context = mean_context or mean_prompt + mean_output / 2  # time-averaged context in the batch
        self._seen = 0  # requests observed from live traffic (`observe`)

    def observe(self, request: RequestInfo) -> None:
        """Learn the mean lengths from live traffic (the router has no workload statistics up front)."""
        self._seen += 1
        weight = 1.0 / self._seen
        self.mean_prompt += weight * (request.prompt_tokens - self.mean_prompt)
        self.mean_output += weight * (request.expected_output_tokens - self.mean_output)
        self.mean_context = self.mean_prompt + self.mean_output / 2

    def choose(self, request: RequestInfo, loads: Sequence[InstanceLoad]) -> int:
        """Index of the instance for `request` among the healthy ones; ServingError when none is healthy."""
        healthy = [i for i, load in enumerate(loads) if load.healthy]
        if not healthy:
            raise ServingError(f"no healthy instance to serve the request (all {len(loads)} are marked down)")
        return self._choose(request, loads, healthy)

    @abstractmethod
    def _choose(self, request: RequestInfo, loads: Sequence[InstanceLoad], healthy: list[int]) -> int: ...


class RoundRobin(Scheduler):
    name = "round_robin"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.next = 0

    def _choose(self, request, loads, healthy):
        for step in range(len(loads)):
            index = (self.next + step) % len(loads)
            if index in healthy:
                self.next = index + 1
                return index
        raise AssertionError("unreachable: healthy is not empty")


class RandomChoice(Scheduler):
    name = "random"

    def _choose(self, request, loads, healthy):
        return self.rng.choice(healthy)


class JoinShortestQueue(Scheduler):
    name = "jsq"

    def _choose(self, request, loads, healthy):
        return min(healthy, key=lambda i: (loads[i].in_flight, self.rng.random()))


class TokenJoinShortestQueue(Scheduler):
    name = "token_jsq"

    def _choose(self, request, loads, healthy):
        return min(healthy, key=lambda i: (loads[i].outstanding_tokens, self.rng.random()))


class PowerOfTwo(Scheduler):
    name = "po2"

    def _choose(self, request, loads, healthy):
        if len(healthy) == 1:
            return healthy[0]
        a, b = self.rng.sample(healthy, 2)
        return a if loads[a].in_flight <= loads[b].in_flight else b


class WeightedRoundRobin(Scheduler):
    """Interleaved weighted round robin: each pick adds work / capacity to the instance's virtual load."""

    name = "weighted_rr"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.virtual: dict[str, float] = {}

    def _choose(self, request, loads, healthy):
        work = request.prompt_tokens + request.expected_output_tokens
        capacities = {
            i: capacity_requests_s(loads[i].spec, self.mean_prompt, self.mean_output, self.mean_context)
            for i in healthy
        }
        floor = min(self.virtual.get(loads[i].spec.name, 0.0) for i in healthy)
        index = min(healthy, key=lambda i: (self.virtual.get(loads[i].spec.name, floor) + work / capacities[i], i))
        self.virtual[loads[index].spec.name] = (
            self.virtual.get(loads[index].spec.name, floor) + work / capacities[index]
        )
        return index


class TrexScheduler(Scheduler):
    """Capacity- and KV-aware: keep every instance's batch within what it serves at the SLOs.

    Each instance has an SLO concurrency B: the largest batch whose TPOT (decode step plus the
    prefills that interleave with it, from its fitted latencies) meets the TPOT SLO and whose
    sequences fit its KV cache at the context the live batch holds; at B it completes a request
    every cycle(B) / B seconds. A request goes to the instance that would drain its in-flight work,
    this request included, soonest - (in flight + 1) * cycle(B) / B - among those whose predicted
    TTFT (the prompts queued there, its own prefill, the wait for a free slot) meets the TTFT SLO;
    when none would, to the one with the earliest predicted first token.
    """

    name = "trex"

    def __init__(self, *args, slo: SLO | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.slo = slo or SLO()
        self._slo_batch: dict[tuple[str, float, float], int] = {}

    def context_in_flight(self, load: InstanceLoad) -> int:
        """Tokens a sequence there holds on average: the workload's time-averaged context, or more
        when the live batch holds longer sequences."""
        context = self.mean_context
        if load.running:
            context = max(context, load.running_context_tokens / load.running)
        return int(context)

    def _prefill_per_request_s(self, spec: InstanceSpec) -> float:
        a0, a1, a2 = spec.latency.prefill
        per_step = spec.limits.prompts_per_prefill(self.mean_prompt)
        return a0 / per_step + a1 * self.mean_prompt + a2 * self.mean_prompt**2

    def slo_batch(self, spec: InstanceSpec, context: int) -> int:
        """The largest batch meeting the TPOT SLO and fitting the KV cache (at least 1)."""
        key = (spec.name, round(context, -1), self.mean_output)
        if key not in self._slo_batch:
            others = self._prefill_per_request_s(spec)
            limit = kv_slots(spec, context)
            batch = 1
            while batch < limit:
                nxt = batch + 1
                tpot = spec.latency.decode_s(nxt, nxt * context) + nxt * others / max(self.mean_output, 1.0)
                if tpot > self.slo.tpot_s:
                    break
                batch = nxt
            self._slo_batch[key] = batch
        return self._slo_batch[key]

    def predicted_ttft_s(self, request: RequestInfo, load: InstanceLoad, slots: int, context: int) -> float:
        spec = load.spec
        a0, a1, a2 = spec.latency.prefill
        steps = math.ceil((load.waiting_prompt_tokens + request.prompt_tokens) / spec.limits.max_batched_tokens)
        if spec.limits.max_prefill_seqs > 0:
            steps = max(steps, math.ceil((load.waiting + 1) / spec.limits.max_prefill_seqs))
        queued = (
            steps * a0
            + a1 * (load.waiting_prompt_tokens + request.prompt_tokens)
            + a2 * (load.waiting_pairs + request.prompt_tokens**2)
        )
        excess = load.in_flight + 1 - slots
        if excess <= 0:
            return queued + spec.latency.decode_s(max(load.running, 1), max(load.running, 1) * context)
        full_cycle = self.mean_output * spec.latency.decode_s(
            slots, slots * context
        ) + slots * self._prefill_per_request_s(spec)
        return queued + excess * full_cycle / slots

    def _choose(self, request, loads, healthy):
        scored = []
        for i in healthy:
            context = self.context_in_flight(loads[i])
            slots = self.slo_batch(loads[i].spec, context)
            ttft = self.predicted_ttft_s(request, loads[i], slots, context)
            spec = loads[i].spec
            cycle = self.mean_output * spec.latency.decode_s(
                slots, slots * context
            ) + slots * self._prefill_per_request_s(spec)
            scored.append((ttft <= self.slo.ttft_s, (loads[i].in_flight + 1) * cycle / slots, ttft, i))
        meeting = [s for s in scored if s[0]]
        if meeting:
            return min(meeting, key=lambda s: (s[1], s[2], s[3]))[3]
        return min(scored, key=lambda s: (s[2], s[3]))[3]


SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (
        RoundRobin,
        RandomChoice,
        JoinShortestQueue,
        TokenJoinShortestQueue,
        PowerOfTwo,
        WeightedRoundRobin,
        TrexScheduler,
    )
}


def make_scheduler(name: str, seed: int = 0, stats: WorkloadStats | None = None, slo: SLO | None = None) -> Scheduler:
    """A scheduler by CLI name; `stats` tells the capacity-aware ones the workload's mean lengths,
    `slo` tells trex's the latency targets it keeps each instance within."""
    if name not in SCHEDULERS:
        raise UnknownNameError("scheduler", name, SCHEDULERS)
    options = {"slo": slo} if name == "trex" else {}
    if stats is None:
        return SCHEDULERS[name](seed, **options)
    return SCHEDULERS[name](seed, stats.mean_prompt, stats.mean_output, stats.context_in_flight, **options)
