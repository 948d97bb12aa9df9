"""What a serving run is judged by: throughput, goodput, TTFT/TPOT percentiles, utilisation, imbalance.

TTFT is arrival to first token; TPOT is (finish - first token) / (output tokens - 1), the mean time
per output token after the first; a request meets the SLO when both are within their targets.
Goodput counts SLO-meeting requests per second; SLO attainment divides them by every request,
dropped and unfinished ones included, so shedding load never looks like success.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from trex.workloads.serving.capacity import SLO


@dataclass(frozen=True)
class RequestRecord:
    id: int
    instance: str  # "" when dropped before reaching one
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # generated (== asked for when completed)
    first_token_s: float | None = None
    finish_s: float | None = None
    status: str = "completed"  # completed | dropped | unfinished | failed
    reason: str = ""
    preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.finish_s is None or self.first_token_s is None:
            return None
        return (self.finish_s - self.first_token_s) / max(self.output_tokens - 1, 1)

    def meets(self, slo: SLO) -> bool:
        return (
            self.status == "completed"
            and self.ttft_s is not None
            and self.ttft_s <= slo.ttft_s
            and self.tpot_s is not None
            and self.tpot_s <= slo.tpot_s
        )


@dataclass(frozen=True)
class ServingReport:
    requests: int
    completed: int
    dropped: int
    unfinished: int
    failed: int
    duration_s: float
    throughput_tok_s: float  # output tokens of completed requests per second of the run (vLLM's benchmark_serving)
    steady_throughput_tok_s: (
        float  # output tokens generated while requests were arriving, per second of that span (nan: unknown)
    )
    request_throughput_req_s: float
    goodput_req_s: float
    slo_attainment: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    latency_p50_s: float
    latency_p99_s: float
    utilisation: dict[str, float]  # per instance: busy fraction of the run
    requests_per_instance: dict[str, int]
    imbalance: float  # max / mean utilisation (1.0: perfectly even)
    slo: dict[str, float]

    def to_dict(self) -> dict:
        return asdict(self)


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarise(
    records: list[RequestRecord],
    slo: SLO,
    busy_s: dict[str, float],
    start_s: float = 0.0,
    steady_tok_s: float = float("nan"),
) -> ServingReport:
    """The report of a run; `steady_tok_s` comes from whoever counted tokens as they were generated
    (the simulator), since a long request's tail otherwise stretches a short run's duration."""
    completed = [r for r in records if r.status == "completed"]
    end = max((r.finish_s for r in completed if r.finish_s is not None), default=start_s)
    duration = max(end - start_s, 1e-9)
    ttft = [r.ttft_s for r in completed if r.ttft_s is not None]
    tpot = [r.tpot_s for r in completed if r.tpot_s is not None and r.output_tokens > 1]
    latency = [r.finish_s - r.arrival_s for r in completed if r.finish_s is not None]
    good = sum(r.meets(slo) for r in records)
    utilisation = {name: busy / duration for name, busy in busy_s.items()}
    mean_util = float(np.mean(list(utilisation.values()))) if utilisation else 0.0
    per_instance: dict[str, int] = {name: 0 for name in busy_s}
    for r in records:
        if r.instance:
            per_instance[r.instance] = per_instance.get(r.instance, 0) + 1
    return ServingReport(
        requests=len(records),
        completed=len(completed),
        dropped=sum(r.status == "dropped" for r in records),
        unfinished=sum(r.status == "unfinished" for r in records),
        failed=sum(r.status == "failed" for r in records),
        duration_s=duration,
        throughput_tok_s=sum(r.output_tokens for r in completed) / duration,
        steady_throughput_tok_s=steady_tok_s,
        request_throughput_req_s=len(completed) / duration,
        goodput_req_s=good / duration,
        slo_attainment=good / len(records) if records else 0.0,
        ttft_p50_s=_percentile(ttft, 50),
        ttft_p99_s=_percentile(ttft, 99),
        tpot_p50_s=_percentile(tpot, 50),
        tpot_p99_s=_percentile(tpot, 99),
        latency_p50_s=_percentile(latency, 50),
        latency_p99_s=_percentile(latency, 99),
        utilisation=utilisation,
        requests_per_instance=per_instance,
        imbalance=max(utilisation.values()) / mean_util if mean_util > 0 else 1.0,
        slo={"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
    )
