"""One serving instance: a model on `tp` devices of one machine type. Memory and step latency.

Memory per device (what vLLM-style engines allocate): the weights' TP shard, an activation
workspace for the largest step, the runtime's reserve (the device profile's `reserved_memory_gib`),
and everything left as KV cache. An instance is feasible when the cache holds at least one
sequence of the longest context it must serve.

Step latency comes from the cost model's device profile, priced op by op from the `ModelSpec`:
weight GEMMs through the tile-wave GEMM model (`DeviceProfile.gemm_time`; a decode step is
memory-bound because the GEMM model's traffic term reads every weight), MoE experts as a grouped
GEMM over the experts the batch touches, prefill attention through the flash-attention model,
decode attention as a memory-bound read of the KV cache, memory-bound kernels at HBM bandwidth, and
two all-reduces per layer over the server's TP link. Serving engines run prefill and decode steps
apart (vLLM's default scheduler), so both are priced separately; `latency_fit` turns samples of
these functions - or measured steps - into the least-squares model the planner and simulator use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from trex.cost_model.devices import DTYPE_BYTES, GIB
from trex.cost_model.model_spec import LayerSpec, ModelSpec
from trex.workloads.serving.cluster_spec import MachineType
from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.kv_cache import KVLayout, kv_layout


@dataclass(frozen=True)
class EngineLimits:
    """Scheduler limits of the serving engine (vLLM's names): tokens per prefill step, sequences per batch."""

    max_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_context: int = 8192  # the longest prompt + output the instance must hold
    max_prefill_seqs: int = 0  # prompts per prefill step (0: as many as max_batched_tokens allows)

    def prompts_per_prefill(self, mean_prompt: float) -> int:
        """Prompts of `mean_prompt` tokens one prefill step packs (at least one)."""
        packed = max(1, int(self.max_batched_tokens // max(mean_prompt, 1)))
        return min(packed, self.max_prefill_seqs) if self.max_prefill_seqs > 0 else packed


def engine_defaults(device) -> EngineLimits:
    """The batch limits vLLM's OpenAI server starts with on `device` (a `DeviceProfile`) when the user
    sets none: vLLM V1's `EngineArgs.get_batch_defaults` gives devices of >= 70 GiB other than the
    A100 (H100, H200, MI300x) max_num_seqs 1024 and max_num_batched_tokens 8192, every other device
    256 and 2048 (vllm-ascend runs the same engine arguments). A planner that capped every type at
    256 would understate what the large-memory types batch, hence their share of the cluster."""
    large = device.memory_gib >= 70 and "a100" not in device.name.lower()
    return EngineLimits(max_batched_tokens=8192, max_num_seqs=1024) if large else EngineLimits(2048, 256)


@dataclass(frozen=True)
class InstanceMemory:
    weights: float
    workspace: float
    reserved: float
    capacity: float  # device memory
    kv_cache: float  # what is left for the KV cache (may be negative: does not fit)
    longest_sequence: float  # KV bytes of one max_context sequence

    @property
    def fits(self) -> bool:
        return self.kv_cache >= self.longest_sequence

    def explain(self) -> str:
        return (
            f"weights {self.weights / GIB:.1f} GiB + workspace {self.workspace / GIB:.1f} GiB "
            f"+ reserve {self.reserved / GIB:.1f} GiB "
            f"of {self.capacity / GIB:.0f} GiB leaves {max(self.kv_cache, 0) / GIB:.1f} GiB of KV cache"
            + ("" if self.fits else f" < {self.longest_sequence / GIB:.2f} GiB for one sequence of the longest context")
        )


@dataclass(frozen=True)
class InstanceModel:
    """`spec` served on `tp` devices of `machine`, weights in `weight_dtype`, KV cache in `kv_dtype`."""

    spec: ModelSpec
    machine: MachineType
    tp: int
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    limits: EngineLimits = field(default_factory=EngineLimits)

    def __post_init__(self) -> None:
        if self.tp not in self.machine.tp_degrees():
            raise ServingError(
                f"TP degree {self.tp} is not possible on {self.machine.name} (count {self.machine.count}, "
                f"{self.machine.devices_per_node} per node); use one of {self.machine.tp_degrees()}"
            )
        if not self.machine.device.supports(self.weight_dtype):
            raise ServingError(
                f"{self.machine.device.name} has no {self.weight_dtype} GEMMs (it supports "
                f"{', '.join(sorted(self.machine.device.peak_tflops))}); choose another weight dtype"
            )

    @property
    def name(self) -> str:
        return f"{self.machine.name}/tp{self.tp}"

    @cached_property
    def kv(self) -> KVLayout:
        return kv_layout(self.spec, self.tp, self.kv_dtype)

    # -- memory ------------------------------------------------------------------------------
    @cached_property
    def weight_bytes(self) -> float:
        """Bytes of weights on one TP rank: column/row-parallel GEMMs and experts split, the rest replicated."""
        tp, spec = self.tp, self.spec
        params = 0.0
        for layer in spec.layers:
            for lin in layer.linears:
                params += lin.params / tp if lin.parallel in ("column", "row") else lin.params
            params += layer.expert_params(spec.hidden_size) / tp + layer.norm_params + layer.extra_params
            params += layer.head_params / tp  # attention sinks, with their heads
        params += (spec.embedding_params + spec.head_params) / tp + spec.final_norm_params
        return params * DTYPE_BYTES[self.weight_dtype]

    @cached_property
    def workspace_bytes(self) -> float:
        """Activations of the largest prefill step (its widest GEMM output, the residual stream and
        norm outputs, all in BF16) and the FP32 logits of a full decode batch."""
        widest = max(
            (
                lin.out_features * lin.groups // (self.tp if lin.parallel == "column" else 1)
                for layer in self.spec.layers
                for lin in layer.linears
            ),
            default=self.spec.hidden_size,
        )
        moe = max(
            (layer.moe.top_k * layer.moe.fc1_out // self.tp for layer in self.spec.layers if layer.moe), default=0
        )
        per_token = 2.0 * (max(widest, moe) + 4 * self.spec.hidden_size * self.spec.residual_streams)
        logits = 4.0 * self.limits.max_num_seqs * self.spec.vocab_size / self.tp
        return self.limits.max_batched_tokens * per_token + logits

    @cached_property
    def memory(self) -> InstanceMemory:
        device = self.machine.device
        reserved = device.reserved_memory_gib * GIB
        kv = device.memory_bytes - reserved - self.weight_bytes - self.workspace_bytes
        return InstanceMemory(
            self.weight_bytes,
            self.workspace_bytes,
            reserved,
            device.memory_bytes,
            kv,
            self.kv.bytes_for(self.limits.max_context),
        )

    @property
    def kv_capacity_bytes(self) -> float:
        return max(self.memory.kv_cache, 0.0)

    # -- analytic step latency ------------------------------------------------------------------
    @cached_property
    def _kinds(self) -> list[tuple[LayerSpec, int]]:
        counts: dict[str, int] = {}
        first: dict[str, LayerSpec] = {}
        for layer in self.spec.layers:
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
            first.setdefault(layer.kind, layer)
        return [(first[kind], n) for kind, n in counts.items()]

    def _gemm_s(self, m: int, n: int, k: int, dtype: str, groups: int = 1) -> float:
        """A GEMM through the device's tile-wave model, except when its output tiles cannot fill one
        wave of the compute units (decode: a few rows): serving kernels then split K over all units
        (cuBLAS split-K, CUTLASS stream-K), so the time is the roofline of weight traffic and FLOPs."""
        device = self.machine.device
        g = device.gemm
        tiles = groups * math.ceil(m / g.tile_m) * math.ceil(n / g.tile_n)
        if tiles >= g.compute_units:
            return device.gemm_time(m, n, k, dtype, groups=groups)
        element = DTYPE_BYTES[dtype]
        traffic = groups * ((m * k + k * n) * element + m * n * 2.0)
        flops = 2.0 * groups * m * n * k
        compute = flops / (device.peak_flops(dtype) * g.ceiling(dtype))
        return device.kernel_overhead_s + max(traffic / (device.hbm_bytes_per_s * device.memory_efficiency), compute)

    def _dense_part_s(self, tokens: int, logits_rows: int) -> float:
        """Weight GEMMs, MoE experts, memory-bound kernels, TP all-reduces and the LM head for `tokens` rows."""
        device, tp, dtype, hidden = self.machine.device, self.tp, self.weight_dtype, self.spec.hidden_size
        total = 0.0
        for layer, count in self._kinds:
            seconds = 0.0
            for lin in layer.linears:
                n, k = lin.out_features, lin.in_features
                if lin.parallel == "column":
                    n = max(1, n // tp)
                elif lin.parallel == "row":
                    k = max(1, k // tp)
                seconds += self._gemm_s(
                    tokens, n, k, "bf16" if dtype == "fp8" and not lin.fp8 else dtype, groups=lin.groups
                )
            if layer.moe is not None:
                moe = layer.moe
                rows = tokens * moe.top_k
                touched = max(1, min(moe.num_experts, rows))
                per_expert = max(1, round(rows / touched))
                seconds += self._gemm_s(per_expert, max(1, moe.fc1_out // tp), hidden, dtype, groups=touched)
                seconds += self._gemm_s(per_expert, hidden, max(1, moe.expert_ffn // tp), dtype, groups=touched)
            for op in layer.pointwise:
                rows = tokens * (layer.moe.top_k if op.moe_rows and layer.moe else 1)
                seconds += device.memory_time(op.bytes_per_token * rows / (tp if op.tp_sharded else 1), op.kernels)
            seconds += 2 * self.machine.allreduce_s(tokens * hidden * 2.0 * self.spec.residual_streams, tp)
            total += count * seconds
        total += self._gemm_s(max(logits_rows, 1), max(1, self.spec.vocab_size // tp), hidden, "bf16")
        return total

    def prefill_step_s(self, prompt_lengths: list[int]) -> float:
        """Seconds for one prefill step over these prompts (compute-bound for long prompts)."""
        if not prompt_lengths:
            return 0.0
        device, tp = self.machine.device, self.tp
        seconds = self._dense_part_s(sum(prompt_lengths), len(prompt_lengths))
        for layer, count in self._kinds:
            for core in layer.attention:
                heads = max(1, core.heads // tp)
                for length in prompt_lengths:
                    keys = core.keys_per_query(length)
                    flops = 2.0 * heads * keys * (core.qk_head_dim + core.v_head_dim) * length
                    seconds += count * device.attention_time(flops, keys, backward=False)
        return seconds

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Seconds for one decode step of `batch` sequences holding `context_tokens` tokens in all
        (bandwidth-bound: every weight and each sequence's KV cache is read once)."""
        if batch <= 0:
            return 0.0
        device = self.machine.device
        seconds = self._dense_part_s(batch, batch)
        per_sequence = max(1, context_tokens // batch)
        kv_bytes = self.kv.bytes_for(per_sequence) * batch
        layers_with_attention = sum(count for layer, count in self._kinds if layer.attention)
        return seconds + device.memory_time(kv_bytes, kernels=layers_with_attention)
