"""Request schedulers behind one interface, shared by the simulator and the live router.

A scheduler sees one `InstanceLoad` per instance (what is queued and running there, its KV-cache
use, its fitted latency model, whether it is healthy) and picks one for the next request. The
simulator keeps the loads exact; the router keeps them from what it dispatched and what came back.

Baselines (the ones production routers ship; see vLLM production-stack and the SGLang router):
`round_robin`, `random`, `jsq` (fewest requests in flight), `token_jsq` (fewest outstanding tokens),
`po2` (power of two choices: the less loaded of two sampled instances), `weighted_rr` (interleaved
weighted round robin on capacity: load += work / capacity, Helix ASPLOS'25's capacity-aware
primitive). `trex` is the capacity- and KV-aware scheduler of arXiv 2504.15303's design: for each
instance it predicts when the request would finish - its queued prefills, its own prefill, its
decode at the batch it would join (slower on a weaker device or a fuller batch) and, when the KV
cache is full, the wait for space - and picks the earliest.
"""

from __future__ import annotations

import math
import random as random_module
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from trex.errors import UnknownNameError
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
    per_step = max(1, int(spec.limits.max_batched_tokens // max(mean_prompt, 1)))
    a0, a1, a2 = spec.latency.prefill
    prefill = a0 / per_step + a1 * mean_prompt + a2 * mean_prompt**2
    return batch / (mean_output * spec.latency.decode_s(batch, batch * context) + batch * prefill)


class Scheduler(ABC):
    name: str = ""

    def __init__(self, seed: int = 0, mean_prompt: float = 256.0, mean_output: float = 256.0, mean_context: float | None = None):
        self.rng = random_module.Random(seed)
        self.mean_prompt, self.mean_output = mean_prompt, mean_output
        self.mean_context = mean_context or mean_prompt + mean_output / 2  # time-averaged context in the batch

    def observe(self, request: RequestInfo) -> None:
        """Learn the mean lengths from live traffic (the router has no workload statistics up front)."""
        self._seen = getattr(self, "_seen", 0) + 1
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
        capacities = {i: capacity_requests_s(loads[i].spec, self.mean_prompt, self.mean_output, self.mean_context) for i in healthy}
        floor = min(self.virtual.get(loads[i].spec.name, 0.0) for i in healthy)
        index = min(healthy, key=lambda i: (self.virtual.get(loads[i].spec.name, floor) + work / capacities[i], i))
        self.virtual[loads[index].spec.name] = self.virtual.get(loads[index].spec.name, floor) + work / capacities[index]
        return index


class TrexScheduler(Scheduler):
    """Earliest expected completion from each instance's fitted latencies, queue and KV-cache state."""

    name = "trex"

    def context_in_flight(self, load: InstanceLoad) -> int:
        """Tokens a sequence there will hold on average: the workload's mean, or more when the live
        batch holds longer sequences (long requests stay in the batch longer, so they dominate it)."""
        context = self.mean_context
        if load.running:
            context = max(context, load.running_context_tokens / load.running)
        return int(context)

    def _prefill_per_request_s(self, spec: InstanceSpec, prompt: float, prompt_sq: float) -> float:
        a0, a1, a2 = spec.latency.prefill
        per_step = max(1, int(spec.limits.max_batched_tokens // max(prompt, 1)))
        return a0 / per_step + a1 * prompt + a2 * prompt_sq

    def expected_completion_s(self, request: RequestInfo, load: InstanceLoad) -> float:
        """Continuous batching as processor sharing: with B sequences in the batch each finishes in one
        cycle, O * d(B) plus the prefills run meanwhile - the prompts already waiting (as they are), and
        one per running slot that frees up and refills - plus its own. Requests beyond the KV cache's
        slots wait for the full batch to free one, at the instance's peak rate."""
        spec = load.spec
        context = self.context_in_flight(load)
        slots = kv_slots(spec, context)
        ahead = load.in_flight + 1
        batch = min(ahead, slots)
        others = self._prefill_per_request_s(spec, self.mean_prompt, self.mean_prompt**2)
        own = spec.latency.prefill_s(request.prompt_tokens, request.prompt_tokens**2)
        a0, a1, a2 = spec.latency.prefill
        queued = (math.ceil(load.waiting_prompt_tokens / spec.limits.max_batched_tokens) * a0 + a1 * load.waiting_prompt_tokens
                  + a2 * load.waiting_pairs)  # the prompts already waiting, as they are
        turnover = max(batch - 1 - load.waiting, 0) * others  # running slots that free up and refill while it decodes
        cycle = request.expected_output_tokens * spec.latency.decode_s(batch, batch * context) + queued + turnover + own
        if ahead <= slots:
            return cycle
        full_cycle = self.mean_output * spec.latency.decode_s(slots, slots * context) + slots * others
        return cycle + (ahead - slots) * full_cycle / slots

    def _choose(self, request, loads, healthy):
        return min(healthy, key=lambda i: (self.expected_completion_s(request, loads[i]), i))


SCHEDULERS: dict[str, type[Scheduler]] = {cls.name: cls for cls in (RoundRobin, RandomChoice, JoinShortestQueue, TokenJoinShortestQueue,
                                                                   PowerOfTwo, WeightedRoundRobin, TrexScheduler)}


def make_scheduler(name: str, seed: int = 0, stats: WorkloadStats | None = None) -> Scheduler:
    """A scheduler by CLI name; `stats` tells the capacity-aware ones the workload's mean lengths."""
    if name not in SCHEDULERS:
        raise UnknownNameError("scheduler", name, SCHEDULERS)
    if stats is None:
        return SCHEDULERS[name](seed)
    return SCHEDULERS[name](seed, stats.mean_prompt, stats.mean_output, stats.context_in_flight)
