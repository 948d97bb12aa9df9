"""Shared pieces of the serving tests: small instance specs with known latencies."""

from __future__ import annotations

from trex.workloads.serving.deployment import InstanceSpec
from trex.workloads.serving.instance_model import EngineLimits
from trex.workloads.serving.kv_cache import KVLayout, KVTerm
from trex.workloads.serving.latency_fit import LatencyModel

KV_PER_TOKEN = 1000.0  # bytes per token in every test instance


def instance(name: str, speed: float, kv_tokens: int = 100_000, max_num_seqs: int = 64) -> InstanceSpec:
    """An instance `speed` times faster than the reference (decode 20 ms + 0.2 ms/sequence)."""
    latency = LatencyModel((0.010 / speed, 0.0002 / speed, 0.0), (0.020 / speed, 0.0002 / speed, 0.0), f"test x{speed}")
    kv = KVLayout((KVTerm(KV_PER_TOKEN),), "gqa", "bf16")
    return InstanceSpec(
        name,
        "test",
        "test",
        1,
        latency,
        kv,
        kv_tokens * KV_PER_TOKEN,
        EngineLimits(max_batched_tokens=4096, max_num_seqs=max_num_seqs, max_context=8192),
    )
