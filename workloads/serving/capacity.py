"""Steady-state throughput of one instance under latency SLOs, from its fitted step latencies.

With continuous batching and prefill steps run apart from decode steps, an instance holding `B`
sequences in decode completes them every `O * decode(B) + B * prefill_per_request` seconds (O: mean
output tokens): every sequence decodes O tokens, and while it does each of the B slots turns over
once, costing one prefill. So per instance

    requests/s = B / (O * d(B) + B * p)       TPOT = d(B) + B * p / O       TTFT ~ d(B) + prefill(P99 prompt)

where d(B) uses the time-averaged context of a sequence in the batch
(`WorkloadStats.context_in_flight`), and p packs prompts into
steps of `max_batched_tokens` (and `max_prefill_seqs`). B is capped by the KV cache (B sequences of that context must fit),
by `max_num_seqs`, and by the SLOs; the largest B that passes gives the instance's throughput.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trex.workloads.serving.instance_model import EngineLimits
from trex.workloads.serving.kv_cache import KVLayout
from trex.workloads.serving.latency_fit import LatencyModel
from trex.workloads.serving.workload import WorkloadStats


@dataclass(frozen=True)
class SLO:
    """Latency targets at the 99th percentile (seconds)."""

    ttft_s: float = 3.0
    tpot_s: float = 0.15

    def describe(self) -> str:
        return f"TTFT P99 <= {self.ttft_s:g} s, TPOT P99 <= {self.tpot_s * 1e3:g} ms"


@dataclass(frozen=True)
class CapacityEstimate:
    batch: int  # sequences decoding together
    requests_s: float
    output_tok_s: float
    tpot_s: float
    ttft_s: float
    limit: str  # what stopped the batch from growing: "max_num_seqs", "kv_cache", "tpot_slo", "ttft_slo"

    @property
    def feasible(self) -> bool:
        return self.batch >= 1


def _at_batch(
    latency: LatencyModel, stats: WorkloadStats, limits: EngineLimits, batch: int
) -> tuple[float, float, float, float]:
    per_step = limits.prompts_per_prefill(stats.mean_prompt)
    a0, a1, a2 = latency.prefill
    prefill_per_request = a0 / per_step + a1 * stats.mean_prompt + a2 * stats.mean_prompt_sq
    decode = latency.decode_s(batch, int(batch * stats.context_in_flight))
    cycle = stats.mean_output * decode + batch * prefill_per_request
    requests_s = batch / cycle
    tpot = decode + batch * prefill_per_request / max(stats.mean_output, 1.0)
    ttft = decode + latency.prefill_s(stats.p99_prompt, stats.p99_prompt**2)
    return requests_s, requests_s * stats.mean_output, tpot, ttft


def estimate_capacity(
    latency: LatencyModel, kv: KVLayout, kv_capacity_bytes: float, limits: EngineLimits, stats: WorkloadStats, slo: SLO
) -> CapacityEstimate:
    """The largest batch meeting memory and SLOs, and its throughput; batch 0 when even one sequence fails."""
    mean_context = int(stats.context_in_flight)
    kv_batch = int(kv_capacity_bytes // max(kv.bytes_for(mean_context), 1.0))
    cap = min(limits.max_num_seqs, kv_batch)
    limit = "max_num_seqs" if limits.max_num_seqs <= kv_batch else "kv_cache"
    if cap < 1:
        return CapacityEstimate(0, 0.0, 0.0, float("inf"), float("inf"), "kv_cache")
    best = CapacityEstimate(0, 0.0, 0.0, float("inf"), float("inf"), limit)
    for batch in range(1, cap + 1):
        requests_s, tok_s, tpot, ttft = _at_batch(latency, stats, limits, batch)
        broken = "ttft_slo" if ttft > slo.ttft_s else "tpot_slo" if tpot > slo.tpot_s else ""
        if broken:
            return replace(best, limit=broken) if best.batch else CapacityEstimate(0, 0.0, 0.0, tpot, ttft, broken)
        best = CapacityEstimate(batch, requests_s, tok_s, tpot, ttft, limit)
    return best


def describe_limit(estimate: CapacityEstimate, slo: SLO) -> str:
    """Why the batch is no larger (or, at batch 0, why the instance cannot serve at all)."""
    if estimate.batch == 0:
        if estimate.limit == "ttft_slo":
            return f"TTFT {estimate.ttft_s:.2f} s > SLO {slo.ttft_s:g} s even at batch 1"
        if estimate.limit == "tpot_slo":
            return f"TPOT {estimate.tpot_s * 1e3:.0f} ms > SLO {slo.tpot_s * 1e3:g} ms even at batch 1"
        return "the KV cache cannot hold one sequence of mean context"
    reasons = {
        "ttft_slo": "the TTFT SLO",
        "tpot_slo": "the TPOT SLO",
        "kv_cache": "the KV cache",
        "max_num_seqs": "max_num_seqs",
    }
    return f"batch {estimate.batch}, capped by {reasons[estimate.limit]}"
