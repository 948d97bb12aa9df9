"""Device profiles: what one accelerator (or this CPU) can do, and how close to peak it gets.

A profile holds the datasheet facts (peak dense throughput per dtype, memory, HBM bandwidth) and
three small performance models shared by every estimate on that device:

* `GemmModel` - tile-wave GEMM time. A GEMM is cut into `tile_m x tile_n` output tiles that run in
  waves over `compute_units` (SMs or AI cores); each tile streams its K dimension plus a fixed
  pipeline fill/drain worth `k_fill` elements of K. A partly filled last wave costs a full wave,
  padded rows and columns cost full tiles. `efficiency[dtype]` is the large-shape ceiling: it is set
  so the model reproduces the published Maximum Achievable Matmul FLOPS (MAMF) at its best shape.
* `AttentionModel` - fused (flash) attention: forward and backward efficiencies that approach their
  ceilings as keys per query grow (a Hockney n_1/2 curve in the key count).
* memory-bound kernels: `time = kernel_overhead + bytes / (hbm_bandwidth * memory_efficiency)`,
  the classic latency-bandwidth (Hockney) model; size-dependent efficiency follows from it.

Profiles load from TOML or JSON (`load_device_profile`), are validated field by field, and `trex
calibrate` writes the `cpu` one from measurements on the machine it runs on.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trex.errors import TrexError, UnknownNameError

DTYPE_BYTES: dict[str, float] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
GIB = 1024**3


@dataclass(frozen=True)
class GemmModel:
    """Tile-wave model of a (grouped) GEMM on a device with `compute_units` parallel engines."""

    compute_units: int
    efficiency: Mapping[str, float]  # large-shape fraction of peak, per dtype
    tile_m: int = 128
    tile_n: int = 128
    k_fill: float = 128.0  # per-tile prologue/epilogue, in elements of K
    launch_us: Mapping[str, float] = field(
        default_factory=dict
    )  # per-dtype fixed cost (default: the device's kernel overhead)
    # Main-loop time factor of an FP8 GEMM run with split accumulation (partial sums promoted to FP32
    # outside the tensor cores, cuBLASLt FAST_ACCUM off) over one accumulating in the tensor cores.
    # Per-tensor-scaled recipes run their data- and weight-gradient GEMMs so; 1.0: not modelled.
    split_accumulation: float = 1.0
    # A grouped GEMM issued as one GEMM call per group pays `launch_us` per group: torch's CPU `_grouped_mm`
    # (ATen/native/GroupedMMUtils.h, `_grouped_mm_fallback`) loops over the groups with one `mm_out` each, where a
    # GPU grouped kernel is one launch for all groups.
    launch_per_group: bool = False

    def ceiling(self, dtype: str) -> float:
        if dtype not in self.efficiency:
            raise TrexError(
                f"no GEMM efficiency for dtype {dtype!r}; the profile defines {', '.join(sorted(self.efficiency))}"
            )
        return self.efficiency[dtype]


@dataclass(frozen=True)
class AttentionModel:
    """Fused attention (FlashAttention-style) efficiency, relative to the BF16 dense peak."""

    forward_efficiency: float
    backward_efficiency: float
    half_keys: float = 256.0  # keys per query at which efficiency is half its ceiling
    # Query/key block of the fused kernels (FlashAttention-2/3 tile 128 x 128): under a causal mask, a block
    # above the diagonal is skipped and one on it is computed whole, masked inside. 0: the exact triangle
    # (the CPU profiles, whose efficiencies `trex calibrate` measures against the triangle's FLOPs).
    block: float = 128.0

    def efficiency(self, keys_per_query: float, backward: bool) -> float:
        ceiling = self.backward_efficiency if backward else self.forward_efficiency
        keys = max(keys_per_query, 1.0)
        return ceiling * keys / (keys + self.half_keys)

    def causal_keys(self, queries: float) -> float:
        """Keys per query (mean) a fused causal kernel computes on a square of `queries` x `queries`.

        Query block i of `block` rows computes the key blocks 0..i whole: (L + block) / 2 keys per query
        when `block` divides L, all L keys when L <= block; with no block, the triangle's (L + 1) / 2.
        Graph-side (`annotate`) and spec-side (`layer_cost`) pricing both count causal attention this way."""
        if queries <= 0:
            return 0.0
        if self.block <= 0:
            return (queries + 1) / 2
        full, rest = divmod(queries, self.block)
        # full query blocks i = 0..full-1 see (i + 1) * block keys; the partial last one sees all of them
        computed = self.block * self.block * full * (full + 1) / 2 + rest * queries
        return computed / queries


@dataclass(frozen=True)
class DeviceProfile:
    """One accelerator: datasheet facts plus the performance models every estimate shares."""

    name: str
    description: str
    peak_tflops: Mapping[str, float]  # dense tensor/cube throughput per dtype (no sparsity)
    memory_gib: float
    hbm_bandwidth_gbs: float
    gemm: GemmModel
    attention: AttentionModel
    memory_efficiency: float = 0.85  # achievable fraction of HBM bandwidth for streaming kernels
    kernel_overhead_us: float = 4.0  # launch + inter-kernel gap per kernel
    reserved_memory_gib: float = 3.0  # runtime context, communicator buffers, allocator fragmentation
    sources: tuple[str, ...] = ()
    calibrated: bool = False
    cache_mib: float = 0.0  # on-chip cache that serves small working sets (0: not modelled)
    cache_bandwidth_gbs: float = 0.0
    op_overhead_us: Mapping[str, float] = field(
        default_factory=dict
    )  # per op kind or op name, replaces kernel_overhead_us
    vector_tflops: float = 0.0  # non-tensor-core element-wise throughput (0: the fp32 peak)
    op_bandwidth_gbs: Mapping[str, float] = field(default_factory=dict)  # per op kind or op name (calibrated CPUs)
    host_op_us: float = (
        0.0  # host CPU time to issue one eager framework op (Python, dispatch, autograd, launch); 0: not modelled
    )
    row_overhead_ns: float = (
        0.0  # CPU element-wise kernels: per inner 1-D loop beyond the first (trex.cost_model.cpu_loops)
    )
    loop_call_overhead_ns: float = 0.0  # ... per 2-D loop call beyond the first
    # CPU row-wise kernels (trex.cost_model.cpu_rows): fp32 lanes per SIMD vector (0: not modelled),
    # ns per element of a softmax whose rows are shorter than a vector ({"forward", "backward"}), and
    # ns per output of a reduction ({"contiguous", "strided"})
    vector_lanes: int = 0
    scalar_softmax_ns: Mapping[str, float] = field(default_factory=dict)
    reduce_output_ns: Mapping[str, float] = field(default_factory=dict)
    comm_units: float = 0.0  # compute units an overlapped communication kernel occupies (0: overlap modelled as free)
    # an eager CPU rank's issue costs (`cost_model.eager_issue`, measured by `trex calibrate`; 0: not modelled):
    # microseconds per op beyond the kernel's fixed cost, extra per DTensor op, per FSDP2 unit forward+backward
    eager_op_us: float = 0.0
    dtensor_op_us: float = 0.0
    fsdp_unit_us: float = 0.0
    _gemm_cache: dict = field(
        default_factory=dict, init=False, compare=False, repr=False
    )  # the planner prices the same shapes often

    def overhead_s(self, op: str, kind: str) -> float:
        """Fixed cost of launching one op: measured per op or per kind when calibrated."""
        if op in self.op_overhead_us:
            return self.op_overhead_us[op] * 1e-6
        return self.op_overhead_us.get(kind, self.kernel_overhead_us) * 1e-6

    def overlap_slowdown_s(self, hidden_s: float) -> float:
        """What hiding `hidden_s` seconds of communication under compute costs that compute: the
        communication kernels hold `comm_units` of the `gemm.compute_units` while they run, so the
        compute beside them runs on the rest (work W next to communication c takes W + c * units/total)."""
        if hidden_s <= 0 or self.comm_units <= 0:
            return 0.0
        return hidden_s * min(1.0, self.comm_units / self.gemm.compute_units)

    def vector_flops(self) -> float:
        return (self.vector_tflops or self.peak_tflops.get("fp32", 1.0)) * 1e12

    def elementwise_time(self, flops: float, bytes_moved: float, kernels: float = 1.0) -> float:
        """An element-wise kernel: bound by memory traffic or by vector arithmetic, whichever is slower."""
        return max(
            self.memory_time(bytes_moved, kernels), kernels * self.kernel_overhead_s + flops / self.vector_flops()
        )

    def op_time(
        self,
        op: str,
        kind: str,
        flops: float,
        bytes_moved: float,
        loops: tuple[int, int] = (1, 1),
        cold_bytes: float = 0.0,
    ) -> float:
        """One memory-bound op: its fixed cost plus the slowest of its traffic at the rate measured
        for it (when calibrated), its traffic through the cache/memory model, and its arithmetic.
        `loops` = (rows, 2-D calls) of a CPU element-wise kernel (`trex.cost_model.cpu_loops`) adds
        their per-loop costs beyond the single row and call a contiguous op pays. `cold_bytes` of its
        reads are not in the cache when it runs (`trex.cost_model.cache_residency`): they stream at the
        memory rate (`cold_read_s`), the rest of its traffic at the rates measured on resident operands."""
        rows, calls = loops
        fixed = (
            self.overhead_s(op, kind)
            + (max(rows - 1, 0) * self.row_overhead_ns + max(calls - 1, 0) * self.loop_call_overhead_ns) * 1e-9
        )
        cold = min(max(cold_bytes, 0.0), bytes_moved)
        memory = self.memory_time(bytes_moved - cold, 1) - self.kernel_overhead_s + self.cold_read_s(cold)
        seconds = max(memory, flops / self.vector_flops())
        rate = self.op_bandwidth_gbs.get(op, self.op_bandwidth_gbs.get(kind))
        if rate:
            seconds = max(seconds, (bytes_moved - cold) / (rate * 1e9) + self.cold_read_s(cold))
        return fixed + seconds

    def cold_read_s(self, cold_bytes: float) -> float:
        """Seconds to read `cold_bytes` that are not in the cache: the memory's streaming rate (the rate
        `memory_time` charges beyond the cache)."""
        return max(cold_bytes, 0.0) / (self.hbm_bytes_per_s * self.memory_efficiency)

    # -- derived quantities, SI units -------------------------------------------------------
    def peak_flops(self, dtype: str = "bf16") -> float:
        if dtype not in self.peak_tflops:
            have = ", ".join(sorted(self.peak_tflops))
            raise TrexError(
                f"device {self.name!r} has no {dtype} throughput (it supports {have}); choose one of those precisions"
            )
        return self.peak_tflops[dtype] * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def usable_memory_bytes(self) -> float:
        return (self.memory_gib - self.reserved_memory_gib) * GIB

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gbs * 1e9

    @property
    def kernel_overhead_s(self) -> float:
        return self.kernel_overhead_us * 1e-6

    def supports(self, dtype: str) -> bool:
        return dtype in self.peak_tflops

    # -- the three performance models ---------------------------------------------------------
    def gemm_time(
        self,
        m: float,
        n: float,
        k: float,
        dtype: str = "bf16",
        groups: int = 1,
        out_bytes: float = 2.0,
        split_accumulation: bool = False,
    ) -> float:
        """Seconds for `groups` GEMMs of [m,k] @ [k,n] each (a grouped GEMM when groups > 1).

        Each output tile runs a main loop over k (+ `k_fill` of pipeline fill) at the per-unit
        share of the dtype's ceiling, then an epilogue that writes `out_bytes` per output element
        (8 when a weight gradient accumulates into an FP32 main-gradient buffer: read + write) at
        the per-unit share of HBM bandwidth. `split_accumulation` (FP8 only) stretches the main
        loop by `gemm.split_accumulation`. Time is monotone non-decreasing in m, n, k.
        """
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        split = split_accumulation and dtype == "fp8"
        key = (m, n, k, dtype, groups, out_bytes, split)
        cached = self._gemm_cache.get(key)
        if cached is not None:
            return cached
        seconds = self._gemm_time(m, n, k, dtype, groups, out_bytes, split)
        if len(self._gemm_cache) < 100_000:
            self._gemm_cache[key] = seconds
        return seconds

    def gemm_time_cold(self, m: float, n: float, k: float, dtype: str, groups: int, cold_bytes: float) -> float:
        """`gemm_time` when `cold_bytes` of its operands are not in the cache when it starts
        (`trex.cost_model.cache_residency`). A CPU GEMM first copies its operand panels into a packed layout
        (Goto & van de Geijn, "Anatomy of high-performance matrix multiplication", ACM TOMS 34(3), 2008), a
        pass that reads them before the arithmetic, not beside it: reading the cold bytes at the memory's rate
        instead of the cache's (at which the calibration's GEMMs, measured on the same operands back to back,
        read them) lengthens the arithmetic side of the model. A GEMM bound by its traffic already reads all of
        it at the memory's rate."""
        base = self.gemm_time(m, n, k, dtype, groups)
        if cold_bytes <= 0 or self.cache_bandwidth_gbs <= 0 or m <= 0 or n <= 0 or k <= 0:
            return base
        launch = self.gemm_launch_s(dtype, groups)
        element = DTYPE_BYTES[dtype]
        memory = groups * ((m * k + k * n) * element + m * n * 2.0) / (self.hbm_bytes_per_s * self.memory_efficiency)
        compute = base - launch  # max(arithmetic, memory)
        if compute <= memory:
            return base
        extra = self.cold_read_s(cold_bytes) - cold_bytes / (self.cache_bandwidth_gbs * 1e9)
        return launch + max(compute + max(extra, 0.0), memory)

    def _gemm_time(
        self, m: float, n: float, k: float, dtype: str, groups: int, out_bytes: float, split: bool = False
    ) -> float:
        g = self.gemm
        tiles = groups * math.ceil(m / g.tile_m) * math.ceil(n / g.tile_n)
        units = g.compute_units
        waves = math.ceil(tiles / units)
        per_unit_flops = self.peak_flops(dtype) * g.ceiling(dtype) / units / (g.split_accumulation if split else 1.0)
        busy = min(tiles, units)
        per_unit_bandwidth = self.hbm_bytes_per_s * self.memory_efficiency / busy
        tile = (
            2.0 * g.tile_m * g.tile_n * (k + g.k_fill) / per_unit_flops
            + g.tile_m * g.tile_n * out_bytes / per_unit_bandwidth
        )
        element = DTYPE_BYTES[dtype]
        traffic = groups * ((m * k + k * n) * element + m * n * out_bytes)
        memory = traffic / (self.hbm_bytes_per_s * self.memory_efficiency)
        return self.gemm_launch_s(dtype, groups) + max(waves * tile, memory)

    def gemm_launch_s(self, dtype: str, groups: int = 1) -> float:
        """The fixed cost of one (grouped) GEMM call: one launch, or one per group when the device issues a
        grouped GEMM as a GEMM per group (`GemmModel.launch_per_group`)."""
        g = self.gemm
        launch = g.launch_us[dtype] * 1e-6 if dtype in g.launch_us else self.kernel_overhead_s
        return launch * (max(1, int(groups)) if g.launch_per_group else 1)

    def gemm_efficiency(self, m: float, n: float, k: float, dtype: str = "bf16", groups: int = 1) -> float:
        """Achieved fraction of the dtype's peak for this shape (time model inverted)."""
        seconds = self.gemm_time(m, n, k, dtype, groups)
        return 2.0 * groups * m * n * k / seconds / self.peak_flops(dtype) if seconds else 0.0

    def attention_time(self, flops: float, keys_per_query: float, backward: bool) -> float:
        """Seconds for a fused attention kernel doing `flops` tensor-core FLOPs (BF16)."""
        if flops <= 0:
            return 0.0
        efficiency = self.attention.efficiency(keys_per_query, backward)
        return self.kernel_overhead_s + flops / (self.peak_flops("bf16") * efficiency)

    def memory_time(self, bytes_moved: float, kernels: float = 1.0) -> float:
        """Seconds for memory-bound kernels moving `bytes_moved` bytes in total.

        With a modelled cache, the first `cache_mib` of traffic per kernel streams at cache
        bandwidth and the rest at memory bandwidth (continuous and monotone in bytes).
        """
        if bytes_moved <= 0 and kernels <= 0:
            return 0.0
        memory = self.hbm_bytes_per_s * self.memory_efficiency
        if self.cache_mib > 0 and self.cache_bandwidth_gbs > 0 and kernels > 0:
            cached = min(bytes_moved, kernels * self.cache_mib * 2**20)
            return (
                kernels * self.kernel_overhead_s
                + cached / (self.cache_bandwidth_gbs * 1e9)
                + (bytes_moved - cached) / memory
            )
        return kernels * self.kernel_overhead_s + bytes_moved / memory


# ---------------------------------------------------------------------------------------------
# Built-in profiles. Peaks are dense (no sparsity) and per SKU; `efficiency` values are the MAMF
# ceilings quoted next to them, divided by the model's own best-shape factor (see _mamf_ceiling).

_MAMF_SOURCE = "Maximum Achievable Matmul FLOPS table, S. Bekman, ml-engineering (compute/accelerator/README.md)"


def ceiling_from_measurement(profile: DeviceProfile, dtype: str, fraction: float, shape: tuple[int, int, int]) -> float:
    """The GEMM ceiling at which `profile`'s tile-wave model reproduces a measured fraction of peak
    (e.g. a published MAMF) at the measured shape: the model is inverted, not fitted."""
    m, n, k = shape
    g = profile.gemm
    tiles = math.ceil(m / g.tile_m) * math.ceil(n / g.tile_n)
    waves = math.ceil(tiles / g.compute_units)
    target = 2.0 * m * n * k / (fraction * profile.peak_flops(dtype))
    busy = min(tiles, g.compute_units)
    epilogue = g.tile_m * g.tile_n * 2.0 / (profile.hbm_bytes_per_s * profile.memory_efficiency / busy)
    launch = g.launch_us[dtype] * 1e-6 if dtype in g.launch_us else profile.kernel_overhead_s
    main = target - launch - waves * epilogue
    if main <= 0:
        raise TrexError(
            f"measured {fraction:.0%} of peak at {shape} is faster than the memory system allows; check the measurement"
        )
    return min(
        1.0, waves * 2.0 * g.tile_m * g.tile_n * (k + g.k_fill) * g.compute_units / (profile.peak_flops(dtype) * main)
    )


def _with_ceilings(profile: DeviceProfile, measured: dict[str, tuple[float, tuple[int, int, int]]]) -> DeviceProfile:
    efficiency = dict(profile.gemm.efficiency)
    for dtype, (fraction, shape) in measured.items():
        efficiency[dtype] = ceiling_from_measurement(profile, dtype, fraction, shape)
    return replace(profile, gemm=replace(profile.gemm, efficiency=efficiency))


def _nvidia(
    name: str,
    description: str,
    *,
    peak: dict[str, float],
    memory_gib: float,
    hbm_gbs: float,
    sms: int,
    measured: dict[str, tuple[float, tuple[int, int, int]]],
    attention: AttentionModel,
    memory_efficiency: float,
    sources: tuple[str, ...],
    split_accumulation: float = 1.0,
) -> DeviceProfile:
    base = DeviceProfile(
        name=name,
        description=description,
        peak_tflops=peak,
        memory_gib=memory_gib,
        hbm_bandwidth_gbs=hbm_gbs,
        gemm=GemmModel(
            compute_units=sms,
            efficiency={dtype: 0.8 for dtype in peak},
            tile_m=128,
            tile_n=256,
            k_fill=64.0,
            split_accumulation=split_accumulation,
        ),
        attention=attention,
        memory_efficiency=memory_efficiency,
        kernel_overhead_us=4.0,
        reserved_memory_gib=3.0,
        sources=sources + (_HOST_OP_SOURCE, _COMM_UNITS_SOURCE),
        host_op_us=DGX_HOST_OP_US,
        comm_units=NVIDIA_COMM_SMS,
    )
    # every half-precision dtype shares the measured ceiling; FP32 keeps the 0.8 default
    same = {dtype: measured["bf16"] for dtype in ("fp16", "tf32") if dtype in peak}
    return _with_ceilings(base, {**same, **measured})


# MAMF measurements: (fraction of peak, best shape M x N x K). Each built-in's GEMM ceiling is the
# value at which its tile-wave model reproduces the measurement (`ceiling_from_measurement`).
MAMF: dict[str, tuple[float, tuple[int, int, int]]] = {
    "a100": (267.9 / 312.0, (6912, 16384, 2048)),  # A100 SXM, CUDA 12.1
    "h100": (792.1 / 989.0, (6144, 17920, 2816)),  # H100 SXM, CUDA 12.1
}
# FP8 with per-block (1x128 / 128x128) scaling: DeepGEMM reports up to ~1550 TFLOP/s on H800
# (78% of 1979); framework kernels (Transformer Engine's blockwise recipe) sit lower: 70% of the
# FP8 peak at the H100 MAMF shape is taken as their large-shape throughput.
HOPPER_FP8_MEASURED = (0.70, MAMF["h100"][1])
# Split accumulation on Hopper: FP8 WGMMA accumulates in reduced precision, so a GEMM that must be
# accurate promotes its partial sums into FP32 registers every few MMAs (CUTLASS issue #2246: "fp32
# accum offloading to CUDA core every 4 mma iter"), cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0.
# Turning it off (fast accumulation) is measured 1.1-1.2x faster (pytorch/ao issue #2377); the midpoint
# is used. Transformer Engine's per-tensor recipes (DelayedScaling, Float8CurrentScaling) run fprop fast
# and dgrad/wgrad split (`fp8_gemm_dgrad/wgrad = MMParams(use_split_accumulator=True)`); blockwise
# scaling rescales every 128-wide K block in FP32 in all three, which the 70% ceiling above already is.
HOPPER_FP8_SPLIT_ACCUMULATION = 1.15
_SPLIT_ACCUMULATION_SOURCE = "FP8 split vs fast accumulation 1.1-1.2x: pytorch/ao issue #2377; TE recipe MMParams"

# FlashAttention-2 (Dao 2023, Fig. 4-6): A100 fwd up to ~70% of peak, fwd+bwd ~60-65% at head dim
# 128 and long sequences. FlashAttention-3 (Shah et al. 2024): H100 BF16 forward 600-740 TFLOP/s
# (60-75%); backward ~1.5-1.75x FlashAttention-2, i.e. ~45-55% of peak.
_A100_ATTENTION = AttentionModel(forward_efficiency=0.72, backward_efficiency=0.60, half_keys=256.0)
_HOPPER_ATTENTION = AttentionModel(forward_efficiency=0.70, backward_efficiency=0.52, half_keys=384.0)

_NVIDIA_DATASHEET = "NVIDIA A100/H100/H200 datasheets (dense tensor-core peaks, memory, HBM bandwidth)"

# Host time per eager op: TransformerEngine issue #2053 (2025-08) measures the CPU time of one
# torch.nn.Linear forward (Python module call, dispatcher, autograd recording, cuBLAS launch) at
# 13.48 us on a DGX H100 (Xeon Platinum 8480C); TE's own Linear costs ~2.7x that on the Grace systems
# of the same table. Megatron runs on such hosts; the plain-PyTorch figure is taken for every op.
DGX_HOST_OP_US = 13.5

# SMs that EP communication kernels hold while they overlap compute (Megatron-Core's 1F1B all-to-all
# overlap, DualPipe): Megatron-Core's --moe-deepep-num-sms defaults to 20 ("Tune the SM count allocated
# to DeepEP communication kernels (default 20)"). Compute hidden beside them runs on the other SMs.
NVIDIA_COMM_SMS = 20.0
_COMM_UNITS_SOURCE = "overlapped EP communication holds 20 SMs: Megatron-Core --moe-deepep-num-sms default"
_HOST_OP_SOURCE = "host op cost: TransformerEngine issue #2053, torch.nn.Linear forward 13.48 us CPU on DGX H100"

# Ascend: peaks from Huawei's torchtitan-npu plugin peak table (devices.md). Cube units: 16x16x16
# FP16 MACs per AI core per cycle; the core counts below follow from the peaks at 1.8-1.9 GHz.
# No public MAMF table exists for Ascend; 0.80 of peak for large cube GEMMs is assumed (Pangu Ultra
# reports >52% MFU at 8K NPUs after fusion, which needs GEMMs well above 70% of peak).
_ASCEND_GEMM = 0.80
_ASCEND_ATTENTION = AttentionModel(forward_efficiency=0.60, backward_efficiency=0.48, half_keys=512.0)
_ASCEND_SOURCES = (
    "torchtitan-npu peak table (910B1-B4)",
    "Pangu Ultra report Sec. 4.1 (Atlas 800T A2)",
    "CloudMatrix384 paper, arXiv 2506.12708 (910C)",
)


def _ascend(
    name: str, description: str, *, bf16: float, memory_gib: float, hbm_gbs: float, cores: int
) -> DeviceProfile:
    return DeviceProfile(
        name=name,
        description=description,
        peak_tflops={"bf16": bf16, "fp16": bf16, "fp32": bf16 / 8.0},
        memory_gib=memory_gib,
        hbm_bandwidth_gbs=hbm_gbs,
        gemm=GemmModel(
            compute_units=cores,
            efficiency={"bf16": _ASCEND_GEMM, "fp16": _ASCEND_GEMM, "fp32": _ASCEND_GEMM},
            tile_m=128,
            tile_n=256,
            k_fill=256.0,
        ),
        attention=_ASCEND_ATTENTION,
        memory_efficiency=0.80,
        kernel_overhead_us=8.0,  # host dispatch on CANN is slower than CUDA launches
        reserved_memory_gib=3.0,
        sources=_ASCEND_SOURCES + (_HOST_OP_SOURCE + "; no public torch_npu figure, the DGX figure is a lower bound",),
        host_op_us=DGX_HOST_OP_US,
    )


def _uncalibrated_cpu() -> DeviceProfile:
    cores = os.cpu_count() or 1
    return DeviceProfile(
        name="cpu",
        description=f"this machine's CPU ({cores} cores), NOT calibrated: run `trex calibrate` to measure it",
        peak_tflops={"fp32": 0.02 * cores, "bf16": 0.005 * cores, "fp16": 0.005 * cores},
        memory_gib=8.0,
        hbm_bandwidth_gbs=10.0,
        # A CPU GEMM's output is computed in register micro-tiles of a few rows by one or two SIMD vectors
        # (OpenBLAS's Haswell sgemm kernel 16 x 4, BLIS's Haswell sgemm 6 x 16; Goto & van de Geijn, "Anatomy of
        # high-performance matrix multiplication", ACM TOMS 2008): rows are padded to that micro-tile, not to a
        # GPU thread block's 64 or 128 (a 32-row expert GEMM is not priced as a 64-row one). 16 x 16 covers
        # both libraries' register tiles; `trex calibrate` fits the machine's own.
        gemm=GemmModel(
            compute_units=cores,
            efficiency={"fp32": 1.0, "bf16": 1.0, "fp16": 1.0},
            tile_m=16,
            tile_n=16,
            k_fill=32.0,
            launch_per_group=True,
        ),
        attention=AttentionModel(forward_efficiency=0.5, backward_efficiency=0.4, half_keys=64.0, block=0.0),
        memory_efficiency=1.0,
        kernel_overhead_us=10.0,
        reserved_memory_gib=0.5,
        sources=(
            "uncalibrated defaults for an unmeasured CPU, not measurements: estimates on `cpu` say so until `trex calibrate` "
            "replaces them",
        ),
    )


def _builtin_profiles() -> dict[str, DeviceProfile]:
    h100_peak = {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9}
    hopper_gemm = {"bf16": MAMF["h100"], "fp8": HOPPER_FP8_MEASURED}
    profiles = [
        _nvidia(
            "a100",
            "NVIDIA A100 SXM 80GB",
            peak={"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
            memory_gib=80,
            hbm_gbs=2039,
            sms=108,
            measured={"bf16": MAMF["a100"]},
            attention=_A100_ATTENTION,
            memory_efficiency=0.85,
            sources=(_NVIDIA_DATASHEET, _MAMF_SOURCE, "FlashAttention-2, Dao 2023"),
        ),
        _nvidia(
            "h100",
            "NVIDIA H100 SXM 80GB",
            peak=h100_peak,
            memory_gib=80,
            hbm_gbs=3350,
            sms=132,
            measured=hopper_gemm,
            attention=_HOPPER_ATTENTION,
            memory_efficiency=0.88,
            sources=(_NVIDIA_DATASHEET, _MAMF_SOURCE, "FlashAttention-3, Shah et al. 2024", _SPLIT_ACCUMULATION_SOURCE),
            split_accumulation=HOPPER_FP8_SPLIT_ACCUMULATION,
        ),
        _nvidia(
            "h800",
            "NVIDIA H800 SXM 80GB (H100 compute, reduced NVLink)",
            peak=h100_peak,
            memory_gib=80,
            hbm_gbs=3350,
            sms=132,
            measured=hopper_gemm,
            attention=_HOPPER_ATTENTION,
            memory_efficiency=0.88,
            sources=(
                _NVIDIA_DATASHEET,
                "DeepSeek-V3 technical report Sec. 3.2.2",
                _MAMF_SOURCE,
                _SPLIT_ACCUMULATION_SOURCE,
            ),
            split_accumulation=HOPPER_FP8_SPLIT_ACCUMULATION,
        ),
        _nvidia(
            "h200",
            "NVIDIA H200 SXM 141GB",
            peak=h100_peak,
            memory_gib=141,
            hbm_gbs=4800,
            sms=132,
            measured=hopper_gemm,
            attention=_HOPPER_ATTENTION,
            memory_efficiency=0.88,
            sources=(_NVIDIA_DATASHEET, _MAMF_SOURCE, _SPLIT_ACCUMULATION_SOURCE),
            split_accumulation=HOPPER_FP8_SPLIT_ACCUMULATION,
        ),
        _ascend("ascend-910b1", "Huawei Ascend 910B1 (64 GB)", bf16=373.88, memory_gib=64, hbm_gbs=1600, cores=24),
        _ascend("ascend-910b2", "Huawei Ascend 910B2 (64 GB)", bf16=353.89, memory_gib=64, hbm_gbs=1600, cores=24),
        _ascend("ascend-910b3", "Huawei Ascend 910B3 (64 GB)", bf16=294.91, memory_gib=64, hbm_gbs=1600, cores=20),
        _ascend("ascend-910b4", "Huawei Ascend 910B4 (32 GB)", bf16=245.76, memory_gib=32, hbm_gbs=800, cores=20),
        _ascend(
            "ascend-910c-die",
            "Huawei Ascend 910C, one die (software sees each die as one NPU)",
            bf16=376.0,
            memory_gib=64,
            hbm_gbs=1600,
            cores=24,
        ),
        _ascend(
            "ascend-910c", "Huawei Ascend 910C package (2 dies)", bf16=752.0, memory_gib=128, hbm_gbs=3200, cores=48
        ),
        _uncalibrated_cpu(),
    ]
    table = {p.name: p for p in profiles}
    # The Atlas 800T A2 ships 910B1-B3 with 64 GB; "ascend-910b" names the B2, Pangu Ultra's device class.
    table["ascend-910b"] = replace(
        table["ascend-910b2"], name="ascend-910b", description="Huawei Ascend 910B (910B2 figures), Atlas 800T A2"
    )
    return table


BUILTIN_DEVICES: dict[str, DeviceProfile] = _builtin_profiles()


def device_names() -> list[str]:
    return sorted(BUILTIN_DEVICES)


def calibration_dir() -> Path:
    """Where `trex calibrate` saves profiles: $TREX_CACHE_DIR or ~/.cache/trex."""
    return Path(os.environ.get("TREX_CACHE_DIR", Path.home() / ".cache" / "trex"))


def calibrated_cpu_path() -> Path:
    return calibration_dir() / "cpu.toml"


def get_device(name_or_path: str | Path) -> DeviceProfile:
    """A built-in device by name, the calibrated CPU profile for `cpu` when one was saved, or a file."""
    key = str(name_or_path)
    if key == "cpu" and calibrated_cpu_path().exists():
        return load_device_profile(calibrated_cpu_path())
    if key in BUILTIN_DEVICES:
        return BUILTIN_DEVICES[key]
    path = Path(key)
    if path.suffix in (".toml", ".json") or path.exists():
        return load_device_profile(path)
    raise UnknownNameError("device", key, BUILTIN_DEVICES, hint="or pass a profile file (.toml or .json)")


# ---------------------------------------------------------------------------------------------
# Profile files. A profile is one [device] table; nested tables gemm, attention and peak_tflops.

_FIELDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "name": (str, "a short identifier, e.g. 'my-npu'"),
    "description": (str, "one line saying what the device is"),
    "memory_gib": ((int, float), "device memory capacity in GiB"),
    "hbm_bandwidth_gbs": ((int, float), "peak memory bandwidth in GB/s"),
    "memory_efficiency": ((int, float), "achievable fraction (0-1] of the memory bandwidth"),
    "kernel_overhead_us": ((int, float), "launch + gap per kernel in microseconds"),
    "reserved_memory_gib": ((int, float), "memory the runtime keeps for itself, in GiB"),
    "sources": (list, "a list of strings citing where the numbers come from"),
    "calibrated": (bool, "true when the numbers were measured by `trex calibrate`"),
    "peak_tflops": (dict, "a table of dtype = dense TFLOP/s, e.g. {bf16 = 989.4}"),
    "gemm": (dict, "a table with compute_units, efficiency, tile_m, tile_n, k_fill"),
    "attention": (dict, "a table with forward_efficiency, backward_efficiency, half_keys"),
    "cache_mib": ((int, float), "cache capacity (MiB) that serves small working sets; 0 to disable"),
    "cache_bandwidth_gbs": ((int, float), "bandwidth of that cache in GB/s"),
    "op_overhead_us": (dict, "a table of op kind or op name = fixed microseconds per call"),
    "vector_tflops": ((int, float), "element-wise (non-tensor-core) throughput in TFLOP/s"),
    "op_bandwidth_gbs": (dict, "a table of op kind or op name = measured GB/s of that op"),
    "host_op_us": ((int, float), "host CPU microseconds to issue one eager framework op (0: host time not modelled)"),
    "row_overhead_ns": ((int, float), "CPU element-wise kernels: nanoseconds per inner loop row beyond the first"),
    "loop_call_overhead_ns": ((int, float), "CPU element-wise kernels: nanoseconds per 2-D loop call beyond the first"),
    "comm_units": ((int, float), "compute units an overlapped communication kernel occupies (0: overlap is free)"),
    "eager_op_us": ((int, float), "eager CPU rank: microseconds to issue one op beyond its kernel's fixed cost"),
    "dtensor_op_us": (
        (int, float),
        "eager CPU rank: extra microseconds per DTensor op (sharding propagation, tp hooks)",
    ),
    "fsdp_unit_us": ((int, float), "eager CPU rank: microseconds of FSDP2 hooks per unit per forward+backward"),
    "vector_lanes": (
        int,
        "CPU: fp32 lanes per SIMD vector; softmax rows shorter than this run scalar (0: not modelled)",
    ),
    "scalar_softmax_ns": (dict, "CPU: a table forward/backward = ns per element of a softmax on the scalar path"),
    "reduce_output_ns": (dict, "CPU: a table contiguous/strided = ns per output of a reduction"),
}
_REQUIRED = ("name", "memory_gib", "hbm_bandwidth_gbs", "peak_tflops", "gemm")
_GEMM_FIELDS = {
    "compute_units": "number of SMs / AI cores",
    "efficiency": "table of dtype = large-shape fraction of peak (0-1]",
    "tile_m": "output tile rows",
    "tile_n": "output tile columns",
    "k_fill": "per-tile pipeline fill in elements of K",
    "launch_us": "table of dtype = fixed microseconds per GEMM call",
    "split_accumulation": "FP8 main-loop time factor with split (FP32-promoted) accumulation, >= 1 (1: not modelled)",
    "launch_per_group": "true when a grouped GEMM is one call per group, each paying launch_us (default: true for cpu)",
}
_ATTENTION_FIELDS = {
    "forward_efficiency": "fraction of BF16 peak (0-1]",
    "backward_efficiency": "fraction of BF16 peak (0-1]",
    "half_keys": "keys per query at half efficiency",
    "block": "query/key block of the fused causal kernel (0: the exact triangle; default 128, 0 for cpu)",
}


def _block(source: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise _fail(
            source, "device.attention.block", f"must be a number >= 0 (got {value!r})", _ATTENTION_FIELDS["block"]
        )
    return float(value)


def _fail(source: str, field_name: str, problem: str, fix: str) -> TrexError:
    return TrexError(f"device profile {source}: field '{field_name}' {problem}; {fix}")


def _positive(source: str, field_name: str, value: Any, fix: str, *, at_most: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _fail(source, field_name, f"must be a positive number (got {value!r})", fix)
    if at_most is not None and value > at_most:
        raise _fail(source, field_name, f"must be at most {at_most} (got {value!r})", fix)
    return float(value)


def _non_negative(source: str, field_name: str, value: Any, fix: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _fail(source, field_name, f"must be a number >= 0 (got {value!r})", fix)
    return float(value)


def _check_known(source: str, prefix: str, table: Mapping[str, Any], known: Mapping[str, Any]) -> None:
    for key in table:
        if key not in known:
            raise _fail(
                source, f"{prefix}{key}", "is not a profile field", f"valid fields here: {', '.join(sorted(known))}"
            )


def device_profile_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> DeviceProfile:
    """Build and validate a profile; every error names the field and says how to fix it."""
    if "device" in data and isinstance(data["device"], Mapping):
        data = data["device"]
    _check_known(source, "device.", data, _FIELDS)
    for key in _REQUIRED:
        if key not in data:
            raise _fail(source, f"device.{key}", "is missing", f"add it: {_FIELDS[key][1]}")
    for key, (kind, fix) in _FIELDS.items():
        if key in data and not isinstance(data[key], kind):
            raise _fail(source, f"device.{key}", f"has type {type(data[key]).__name__}", f"expected {fix}")
    peak = {}
    for dtype, value in data["peak_tflops"].items():
        if dtype not in DTYPE_BYTES:
            raise _fail(
                source, f"device.peak_tflops.{dtype}", "is not a known dtype", f"use one of {', '.join(DTYPE_BYTES)}"
            )
        peak[dtype] = _positive(source, f"device.peak_tflops.{dtype}", value, "give dense TFLOP/s")
    if not peak:
        raise _fail(source, "device.peak_tflops", "is empty", "give at least one dtype, e.g. bf16 = 989.4")
    gemm_table = data["gemm"]
    _check_known(source, "device.gemm.", gemm_table, _GEMM_FIELDS)
    if "compute_units" not in gemm_table or "efficiency" not in gemm_table:
        raise _fail(
            source, "device.gemm", "needs compute_units and efficiency", "add both (see `trex calibrate --help`)"
        )
    units = gemm_table["compute_units"]
    if isinstance(units, bool) or not isinstance(units, int) or units <= 0:
        raise _fail(
            source,
            "device.gemm.compute_units",
            f"must be a positive integer (got {units!r})",
            _GEMM_FIELDS["compute_units"],
        )
    efficiency_table = gemm_table["efficiency"]
    if not isinstance(efficiency_table, Mapping):
        raise _fail(source, "device.gemm.efficiency", "must be a table", _GEMM_FIELDS["efficiency"])
    efficiency = {}
    for dtype, value in efficiency_table.items():
        if dtype not in peak:
            raise _fail(
                source,
                f"device.gemm.efficiency.{dtype}",
                "has no matching peak_tflops entry",
                f"add peak_tflops.{dtype} or remove it",
            )
        efficiency[dtype] = _positive(
            source, f"device.gemm.efficiency.{dtype}", value, "a fraction of peak in (0, 1]", at_most=1.0
        )
    missing = sorted(set(peak) - set(efficiency))
    if missing:
        raise _fail(
            source,
            "device.gemm.efficiency",
            f"lacks {', '.join(missing)}",
            "give an efficiency for every dtype in peak_tflops",
        )
    per_group = gemm_table.get("launch_per_group", data["name"] == "cpu")
    if not isinstance(per_group, bool):
        raise _fail(
            source,
            "device.gemm.launch_per_group",
            f"must be true or false (got {per_group!r})",
            _GEMM_FIELDS["launch_per_group"],
        )
    gemm = GemmModel(
        compute_units=units,
        efficiency=efficiency,
        tile_m=int(_positive(source, "device.gemm.tile_m", gemm_table.get("tile_m", 128), _GEMM_FIELDS["tile_m"])),
        tile_n=int(_positive(source, "device.gemm.tile_n", gemm_table.get("tile_n", 128), _GEMM_FIELDS["tile_n"])),
        k_fill=float(gemm_table.get("k_fill", 128.0)),
        launch_us={
            dtype: _positive(source, f"device.gemm.launch_us.{dtype}", value, _GEMM_FIELDS["launch_us"])
            for dtype, value in gemm_table.get("launch_us", {}).items()
        },
        split_accumulation=_positive(
            source,
            "device.gemm.split_accumulation",
            gemm_table.get("split_accumulation", 1.0),
            _GEMM_FIELDS["split_accumulation"],
        ),
        launch_per_group=per_group,
    )
    if gemm.split_accumulation < 1.0:
        raise _fail(
            source,
            "device.gemm.split_accumulation",
            f"must be >= 1 (got {gemm.split_accumulation})",
            _GEMM_FIELDS["split_accumulation"],
        )
    if gemm.k_fill < 0:
        raise _fail(source, "device.gemm.k_fill", f"must be >= 0 (got {gemm.k_fill})", _GEMM_FIELDS["k_fill"])
    attention_table = data.get("attention", {"forward_efficiency": 0.6, "backward_efficiency": 0.45})
    _check_known(source, "device.attention.", attention_table, _ATTENTION_FIELDS)
    attention = AttentionModel(
        forward_efficiency=_positive(
            source,
            "device.attention.forward_efficiency",
            attention_table.get("forward_efficiency", 0.6),
            "(0, 1]",
            at_most=1.0,
        ),
        backward_efficiency=_positive(
            source,
            "device.attention.backward_efficiency",
            attention_table.get("backward_efficiency", 0.45),
            "(0, 1]",
            at_most=1.0,
        ),
        half_keys=_positive(
            source,
            "device.attention.half_keys",
            attention_table.get("half_keys", 256.0),
            _ATTENTION_FIELDS["half_keys"],
        ),
        block=_block(source, attention_table.get("block", 0.0 if data["name"] == "cpu" else 128.0)),
    )
    sources = data.get("sources", [])
    if not all(isinstance(s, str) for s in sources):
        raise _fail(source, "device.sources", "must hold strings only", _FIELDS["sources"][1])
    return DeviceProfile(
        name=data["name"],
        description=data.get("description", data["name"]),
        peak_tflops=peak,
        memory_gib=_positive(source, "device.memory_gib", data["memory_gib"], _FIELDS["memory_gib"][1]),
        hbm_bandwidth_gbs=_positive(
            source, "device.hbm_bandwidth_gbs", data["hbm_bandwidth_gbs"], _FIELDS["hbm_bandwidth_gbs"][1]
        ),
        gemm=gemm,
        attention=attention,
        memory_efficiency=_positive(
            source, "device.memory_efficiency", data.get("memory_efficiency", 0.85), "a fraction in (0, 1]", at_most=1.0
        ),
        kernel_overhead_us=float(data.get("kernel_overhead_us", 4.0)),
        reserved_memory_gib=float(data.get("reserved_memory_gib", 0.0)),
        sources=tuple(sources),
        calibrated=bool(data.get("calibrated", False)),
        cache_mib=float(data.get("cache_mib", 0.0)),
        cache_bandwidth_gbs=float(data.get("cache_bandwidth_gbs", 0.0)),
        op_overhead_us={
            key: _positive(source, f"device.op_overhead_us.{key}", value, "microseconds per call")
            for key, value in data.get("op_overhead_us", {}).items()
        },
        vector_tflops=float(data.get("vector_tflops", 0.0)),
        op_bandwidth_gbs={
            key: _positive(source, f"device.op_bandwidth_gbs.{key}", value, "GB/s")
            for key, value in data.get("op_bandwidth_gbs", {}).items()
        },
        host_op_us=_non_negative(source, "device.host_op_us", data.get("host_op_us", 0.0), _FIELDS["host_op_us"][1]),
        row_overhead_ns=_non_negative(
            source, "device.row_overhead_ns", data.get("row_overhead_ns", 0.0), _FIELDS["row_overhead_ns"][1]
        ),
        loop_call_overhead_ns=_non_negative(
            source,
            "device.loop_call_overhead_ns",
            data.get("loop_call_overhead_ns", 0.0),
            _FIELDS["loop_call_overhead_ns"][1],
        ),
        comm_units=_non_negative(source, "device.comm_units", data.get("comm_units", 0.0), _FIELDS["comm_units"][1]),
        **{
            key: _non_negative(source, f"device.{key}", data.get(key, 0.0), _FIELDS[key][1])
            for key in ("eager_op_us", "dtensor_op_us", "fsdp_unit_us")
        },
        vector_lanes=int(
            _non_negative(source, "device.vector_lanes", data.get("vector_lanes", 0), _FIELDS["vector_lanes"][1])
        ),
        scalar_softmax_ns=_row_table(source, "scalar_softmax_ns", data, ("forward", "backward")),
        reduce_output_ns=_row_table(source, "reduce_output_ns", data, ("contiguous", "strided")),
    )


def _row_table(source: str, name: str, data: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, float]:
    table = data.get(name, {})
    _check_known(source, f"device.{name}.", table, {key: None for key in keys})
    return {key: _non_negative(source, f"device.{name}.{key}", value, _FIELDS[name][1]) for key, value in table.items()}


def read_profile_file(path: str | Path) -> dict[str, Any]:
    """Parse a TOML or JSON file into a dict, with the parser's line and column on error."""
    path = Path(path)
    if not path.exists():
        raise TrexError(
            f"profile file {path} does not exist; write one (TOML or JSON) or run `trex calibrate` to create the cpu profile"
        )
    text = path.read_text()
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise TrexError(
                f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
            ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise TrexError(f"{path}: not valid TOML ({error}); profiles are TOML (.toml) or JSON (.json)") from None


def load_device_profile(path: str | Path) -> DeviceProfile:
    return device_profile_from_dict(read_profile_file(path), source=str(path))


def device_profile_to_dict(profile: DeviceProfile) -> dict[str, Any]:
    return {
        "device": {
            "name": profile.name,
            "description": profile.description,
            "memory_gib": profile.memory_gib,
            "hbm_bandwidth_gbs": profile.hbm_bandwidth_gbs,
            "memory_efficiency": profile.memory_efficiency,
            "kernel_overhead_us": profile.kernel_overhead_us,
            "reserved_memory_gib": profile.reserved_memory_gib,
            "calibrated": profile.calibrated,
            "cache_mib": profile.cache_mib,
            "cache_bandwidth_gbs": profile.cache_bandwidth_gbs,
            "op_overhead_us": dict(profile.op_overhead_us),
            "vector_tflops": profile.vector_tflops,
            "op_bandwidth_gbs": dict(profile.op_bandwidth_gbs),
            "host_op_us": profile.host_op_us,
            "row_overhead_ns": profile.row_overhead_ns,
            "loop_call_overhead_ns": profile.loop_call_overhead_ns,
            "comm_units": profile.comm_units,
            "eager_op_us": profile.eager_op_us,
            "dtensor_op_us": profile.dtensor_op_us,
            "fsdp_unit_us": profile.fsdp_unit_us,
            "vector_lanes": profile.vector_lanes,
            "scalar_softmax_ns": dict(profile.scalar_softmax_ns),
            "reduce_output_ns": dict(profile.reduce_output_ns),
            "sources": list(profile.sources),
            "peak_tflops": dict(profile.peak_tflops),
            "gemm": {
                "compute_units": profile.gemm.compute_units,
                "tile_m": profile.gemm.tile_m,
                "tile_n": profile.gemm.tile_n,
                "k_fill": profile.gemm.k_fill,
                "efficiency": dict(profile.gemm.efficiency),
                "launch_us": dict(profile.gemm.launch_us),
                "split_accumulation": profile.gemm.split_accumulation,
                "launch_per_group": profile.gemm.launch_per_group,
            },
            "attention": {
                "forward_efficiency": profile.attention.forward_efficiency,
                "backward_efficiency": profile.attention.backward_efficiency,
                "half_keys": profile.attention.half_keys,
                "block": profile.attention.block,
            },
        }
    }


def save_device_profile(profile: DeviceProfile, path: str | Path) -> Path:
    """Write a profile as TOML (or JSON when the path ends in .json); it loads back identically."""
    from trex.cost_model.toml_writer import dumps

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = device_profile_to_dict(profile)
    path.write_text(json.dumps(data, indent=2) + "\n" if path.suffix == ".json" else dumps(data))
    return path
