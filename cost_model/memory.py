"""Memory per device: weights, gradients, optimizer states, activations, transient peaks.

Mixed-precision training keeps BF16 weights (FP32 when training in FP32; FP8 recipes add a 1-byte
copy of each GEMM weight), a main-gradient buffer in `grad_dtype`, and optimizer state: an FP32
master copy plus AdamW's two moments or Muon's one momentum in `optimizer_state_dtype` (DeepSeek-V4
uses Muon for its hidden matrices and AdamW for embeddings, head and vectors). ZeRO shards across
the data-parallel ranks (expert weights across the expert-data-parallel ranks): stage 1 (Megatron's
distributed optimizer) the optimizer state, stage 2 also the gradients, stage 3 also the weights.
Activations are the saved bytes of each chunk times the micro-batches in flight at the schedule's
peak (1F1B: pp - stage; interleaved: Megatron's warm-up count + 1), so the first stage holds the most.
"""

from __future__ import annotations

from dataclasses import dataclass

from trex.cost_model.devices import DTYPE_BYTES, GIB, DeviceProfile


@dataclass(frozen=True)
class ParamCounts:
    """Parameters one device holds, split by how they are sharded and optimised."""

    dense: float = 0.0  # replicated across data parallelism (DP group)
    expert: float = 0.0  # replicated across expert data parallelism (EDP group)
    muon: float = 0.0  # of the above, optimised by Muon (2-D hidden matrices) when Muon is used
    fp8_gemm: float = 0.0  # weights that run through FP8 GEMMs (an FP8 copy is kept)

    @property
    def total(self) -> float:
        return self.dense + self.expert

    def scaled(self, factor: float) -> ParamCounts:
        return ParamCounts(self.dense * factor, self.expert * factor, self.muon * factor, self.fp8_gemm * factor)

    def __add__(self, other: ParamCounts) -> ParamCounts:
        return ParamCounts(
            self.dense + other.dense, self.expert + other.expert, self.muon + other.muon, self.fp8_gemm + other.fp8_gemm
        )


@dataclass(frozen=True)
class MemoryEstimate:
    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    transient: float
    capacity: float  # usable bytes on the device (capacity minus the runtime's reserve)

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer_states + self.activations + self.transient

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def gib(self) -> dict[str, float]:
        return {
            "weights": self.weights / GIB,
            "gradients": self.gradients / GIB,
            "optimizer_states": self.optimizer_states / GIB,
            "activations": self.activations / GIB,
            "transient": self.transient / GIB,
            "total": self.total / GIB,
            "capacity": self.capacity / GIB,
        }


def static_memory(
    params: ParamCounts,
    *,
    dp: int,
    edp: int,
    zero: int,
    precision: str,
    grad_dtype: str,
    state_dtype: str,
    muon: bool,
    param_dtype: str | None = None,
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) in bytes for the parameters on one device.

    `param_dtype` (`ParallelConfig.param_dtype`): None stores the weights in the compute precision with an fp32
    master copy among the optimizer states when that precision is lower; fp32 parameters are stepped directly
    (autocast computes in `precision` from them), so no master copy exists."""
    weight_bytes = parameter_bytes(precision, param_dtype)
    shard_dense, shard_expert = (dp, edp)

    def sharded(dense_bytes: float, expert_bytes: float, on: bool) -> float:
        return dense_bytes / shard_dense + expert_bytes / shard_expert if on else dense_bytes + expert_bytes

    weights = sharded(params.dense * weight_bytes, params.expert * weight_bytes, zero >= 3)
    weights += params.fp8_gemm * 1.0 if precision == "fp8" else 0.0
    grad = DTYPE_BYTES[grad_dtype]
    gradients = sharded(params.dense * grad, params.expert * grad, zero >= 2)
    master = 0.0 if weight_bytes >= 4.0 else 4.0
    state = DTYPE_BYTES[state_dtype]
    muon_share = params.muon / params.total if (muon and params.total) else 0.0
    per_param = master + state * (1.0 * muon_share + 2.0 * (1.0 - muon_share))
    states = sharded(params.dense * per_param, params.expert * per_param, zero >= 1)
    return weights, gradients, states


def parameter_bytes(precision: str, param_dtype: str | None = None) -> float:
    """Bytes per stored parameter: `param_dtype`'s, else 4 in fp32 training and 2 (bf16 weights) otherwise."""
    if param_dtype is not None:
        return float(DTYPE_BYTES[param_dtype])
    return 4.0 if precision == "fp32" else 2.0


def activation_memory(chunk_saved: list[float], in_flight: list[int]) -> float:
    """Saved activations of a device's chunks times micro-batches in flight at the peak."""
    return sum(saved * count for saved, count in zip(chunk_saved, in_flight))


def optimizer_step_time(
    params: ParamCounts,
    device: DeviceProfile,
    *,
    dp: int,
    edp: int,
    zero: int,
    grad_dtype: str,
    state_dtype: str,
    muon: bool,
    muon_flops: float,
) -> float:
    """A memory-bound element-wise update over this device's optimizer shard (+ Muon's Newton-Schulz)."""
    shard = params.dense / (dp if zero >= 1 else 1) + params.expert / (edp if zero >= 1 else 1)
    g, s = DTYPE_BYTES[grad_dtype], DTYPE_BYTES[state_dtype]
    muon_share = params.muon / params.total if (muon and params.total) else 0.0
    # read master + grad + moments, write master + moments + the BF16 working copy
    adam_bytes = 4 + g + 2 * s + 4 + 2 * s + 2
    muon_bytes = 4 + g + s + 4 + s + 2
    per_param = muon_share * muon_bytes + (1 - muon_share) * adam_bytes
    seconds = device.memory_time(shard * per_param, 8)
    if muon and muon_flops:
        seconds += muon_flops / (device.peak_flops("bf16") * device.gemm.ceiling("bf16") * 0.8)
    return seconds
