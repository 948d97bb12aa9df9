"""`trex calibrate`: measure this machine and write the `cpu` device profile and cluster tier.

Microbenchmarks, each timed as the fastest of repeated runs after warm-up (the least-disturbed run:
on a shared machine other processes only ever add time):

* matmul (fp32 and bf16) over a ladder of square and skinny shapes. The peak is the best measured
  throughput; the GEMM ceiling is set so the tile-wave model reproduces it at its shape
  (`ceiling_from_measurement`), and the per-tile pipeline fill `k_fill` is the grid value that best
  fits every other shape (least squares on log time).
* streaming copy of large buffers: the memory bandwidth (bytes read + written per second).
* element-wise add over sizes from one element up: the per-op overhead (the intercept of the
  latency-bandwidth line), the bandwidth of working sets that fit the per-core cache (its slope
  below the cache size) and the achievable fraction of the copy bandwidth (its slope above).
* one representative op of each kind, each trex MoE op, the composite `_safe_softmax`, and the
  element-wise overloads captured graphs are made of (with the argument kinds they get there) at two
  sizes: the fixed cost per call and the bytes per second (`op_overhead_us`, `op_bandwidth_gbs`),
  which decide small graphs on a CPU (a division or a compare-with-scalar costs several additions).
* TensorIterator loop overheads: an element-wise op over rows of 2 that cannot coalesce (per row)
  and one broadcast over a middle dimension (per 2-D loop call), against the same bytes contiguous
  (`trex.cost_model.cpu_loops` counts the rows and calls of every captured element-wise node).
* row-wise kernels (`trex.cost_model.cpu_rows`): softmax forward and backward over rows of 2 to 64
  (the SIMD width, below which the scalar fallback runs, and its per-element cost) and sums over
  rows of 2, contiguous and across a middle dimension (the cost per output).
* the tensor-with-Python-number forms of add, sub, mul and div (the number is wrapped into a 0-d
  tensor on every call: twice the fixed cost of the tensor-tensor form on a CPU).
* exp over a cache-resident buffer: element-wise arithmetic throughput, for ops bound by
  arithmetic rather than memory traffic (softmax, activations) on a CPU.
* fused attention forward and backward (`scaled_dot_product_attention`): efficiency vs the fp32 peak.
* collectives over gloo between 2 local processes (all_reduce, all_gather, reduce_scatter,
  all_to_all): latency and bandwidth of an alpha-beta line fitted to all_reduce, the others kept as data.
* an eager rank's issue costs (`trex.cost_model.eager_issue`, with the collectives: a process of its own on a
  fake process group): per op beyond the kernel's fixed cost, extra per DTensor op, per FSDP2 unit pass.

`fast=True` runs the same code on small sizes with few repetitions (a few seconds), for tests.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from trex.cost_model.catalog import UNCALIBRATED_GLOO_LATENCY_US
from trex.cost_model.cluster import Cluster, MeasuredCollective, Tier, cluster_to_dict
from trex.cost_model.cpu_loops import tensor_iterator_loops
from trex.cost_model.devices import AttentionModel, DeviceProfile, GemmModel, calibrated_cpu_path
from trex.cost_model.eager_issue_measure import measure_eager_costs_apart


@dataclass
class Calibration:
    profile: DeviceProfile
    tier: Tier
    matmul: list[tuple[str, int, int, int, float]] = field(default_factory=list)  # dtype, m, n, k, seconds
    copy: list[tuple[float, float]] = field(default_factory=list)  # bytes moved, seconds
    pointwise: list[tuple[float, float]] = field(default_factory=list)
    attention: list[tuple[str, float, float]] = field(default_factory=list)  # direction, flops, seconds
    collectives: list[tuple[str, int, float, float]] = field(default_factory=list)  # kind, group, bytes, seconds
    kinds: dict[str, tuple[float, float]] = field(
        default_factory=dict
    )  # op kind / op -> (seconds per call, bytes per second)
    loops: tuple[float, float] = (0.0, 0.0)  # ns per TensorIterator row, ns per 2-D loop call
    rows: RowCosts | None = None  # softmax / reduction row costs
    vector_flops: float = 0.0
    eager: dict[str, Any] = field(default_factory=dict)  # eager issue costs and what they came from (eager_issue)
    seconds: float = 0.0

    def cluster(self) -> Cluster:
        return Cluster(
            "cpu",
            f"this machine, calibrated: {self.profile.description}",
            self.profile,
            (self.tier,),
            1,
            cores=host_cores(),
        )


def best_time(fn: Callable[[], Any], repeats: int, warmup: int = 2, min_seconds: float = 0.0) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    spent = 0.0
    while len(samples) < repeats or spent < min_seconds:
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        samples.append(elapsed)
        spent += elapsed
        if len(samples) >= 10 * repeats:
            break
    return min(samples)


def _batched_time(fn: Callable[[], Any], inner: int, repeats: int) -> float:
    """Median time of one call, timing `inner` calls at once (for calls of a few microseconds)."""

    def many() -> None:
        for _ in range(inner):
            fn()

    return best_time(many, repeats) / inner


def measure_matmul(
    shapes: list[tuple[int, int, int]], dtypes: tuple[str, ...], repeats: int
) -> list[tuple[str, int, int, int, float]]:
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}
    out = []
    for dtype in dtypes:
        for m, n, k in shapes:
            a = torch.randn(m, k, dtype=torch_dtype[dtype])
            b = torch.randn(k, n, dtype=torch_dtype[dtype])
            inner = max(1, int(2e7 / (2 * m * n * k)))
            out.append((dtype, m, n, k, _batched_time(lambda: torch.mm(a, b), inner, repeats)))
    return out


def measure_copy(sizes: list[int], repeats: int) -> list[tuple[float, float]]:
    out = []
    for elements in sizes:
        x = torch.empty(elements, dtype=torch.float32).uniform_()
        y = torch.empty_like(x)
        seconds = best_time(lambda: y.copy_(x), repeats)
        out.append((2.0 * elements * 4, seconds))
    return out


def measure_pointwise(sizes: list[int], repeats: int) -> list[tuple[float, float]]:
    out = []
    for elements in sizes:
        x = torch.rand(elements)
        y = torch.rand(elements)
        z = torch.empty(elements)  # written in place: the kernel, not the first-touch page faults of a fresh buffer
        inner = max(1, min(2000, int(1e6 / max(elements, 1))))
        out.append((3.0 * elements * 4, _batched_time(lambda: torch.add(x, y, out=z), inner, repeats)))
    return out


def _kind_cases(rows: int) -> dict[str, tuple[Any, tuple]]:
    """One representative call per op kind (and per trex MoE op, and the composite softmax eager
    attention uses) on `rows` x 64 fp32 elements: priced against its formula at two sizes."""
    import trex.ops  # noqa: F401 - registers torch.ops.trex

    aten, ops = torch.ops.aten, torch.ops.trex
    x, y = torch.rand(rows, 64), torch.rand(rows, 64)
    index = torch.randint(0, 8, (rows, 2))
    weights = torch.rand(rows, 2)
    experts = torch.rand(8, 64, 64)
    sorted_hidden, perm, offsets = ops.moe_dispatch(x, index, 8)
    q = torch.rand(1, 1, rows, 64)
    mask = torch.rand(rows, 64) > 0.5
    return {
        "pointwise": (aten.add.Tensor, (x, y)),
        "reduction": (aten.sum.dim_IntList, (x, [1])),
        "copy": (aten.clone.default, (y.t(),)),  # clones in captured graphs mostly make transposed views contiguous
        "creation": (aten.zeros.default, ([rows, 64],)),
        "gather_scatter": (aten.index_select.default, (x, 0, torch.randint(0, rows, (rows,)))),
        "sort": (aten.topk.default, (x, 8)),
        "softmax": (aten._softmax.default, (x, -1, False)),
        "aten._safe_softmax": (aten._safe_softmax.default, (x, -1)),
        "aten.where": (aten.where.self, (mask, x, torch.tensor(0.0))),
        "norm": (aten.native_layer_norm.default, (x, [64], None, None, 1e-5)),
        "loss": (aten.nll_loss_forward.default, (x, index[:, 0], None, 1, -100)),
        "attention": (aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q)),
        "trex.moe_dispatch": (ops.moe_dispatch.default, (x, index, 8)),
        "trex.moe_dispatch_backward": (ops.moe_dispatch_backward.default, (sorted_hidden, perm, rows)),
        "trex.grouped_mm": (ops.grouped_mm.default, (sorted_hidden, experts, offsets)),
        "trex.grouped_mm_weight_grad": (ops.grouped_mm_weight_grad.default, (sorted_hidden, sorted_hidden, offsets)),
        "trex.moe_combine": (ops.moe_combine.default, (sorted_hidden, perm, weights)),
        "trex.moe_combine_backward": (ops.moe_combine_backward.default, (x, sorted_hidden, perm, weights)),
    }


def _elementwise_cases(rows: int) -> dict[str, tuple[Any, tuple]]:
    """The element-wise overloads captured training graphs are made of, each with the argument
    kinds it gets there (tensor-tensor, tensor-scalar, broadcast): CPU kernels differ per overload."""
    aten = torch.ops.aten
    x, y = torch.rand(rows, 64) + 0.5, torch.rand(rows, 64) + 0.5
    column = torch.rand(rows, 1) + 0.5
    return {
        "aten.add.Tensor": (aten.add.Tensor, (x, y)),
        "aten.sub.Tensor": (aten.sub.Tensor, (x, y)),
        "aten.mul.Tensor": (aten.mul.Tensor, (x, column)),
        "aten.mul.Scalar": (aten.mul.Scalar, (x, 0.5)),
        "aten.div.Tensor": (aten.div.Tensor, (x, column)),
        "aten.div.Scalar": (aten.div.Scalar, (x, 3.0)),
        "aten.pow.Tensor_Scalar": (aten.pow.Tensor_Scalar, (x, 2)),
        "aten.neg.default": (aten.neg.default, (x,)),
        "aten.rsqrt.default": (aten.rsqrt.default, (x,)),
        "aten.exp.default": (aten.exp.default, (x,)),
        "aten.clamp.default": (aten.clamp.default, (x, 0.1, 0.9)),
        "aten.silu.default": (aten.silu.default, (x,)),
        "aten.silu_backward.default": (aten.silu_backward.default, (y, x)),
        "aten.sigmoid.default": (aten.sigmoid.default, (x,)),
        "aten.le.Scalar": (aten.le.Scalar, (x, 0.7)),
        "aten.ge.Tensor": (aten.ge.Tensor, (x, y)),
        "aten.where.self": (aten.where.self, (x > 0.7, x, torch.tensor(0.0))),
        "aten.masked_fill.Scalar": (aten.masked_fill.Scalar, (x, x > 0.7, 0.0)),
        "prims.convert_element_type.default": (torch.ops.prims.convert_element_type.default, (x, torch.bfloat16)),
        "aten.cat.default": (aten.cat.default, ([x, y], -1)),
        "aten._to_copy.default": (aten._to_copy.default, (x,)),
        "aten.slice_backward.default": (aten.slice_backward.default, (x, [rows, 128], 1, 0, 64, 1)),
        # a Python number operand is wrapped into a 0-d tensor on every call (see annotate._measured_name)
        "aten.add.Tensor[scalar]": (aten.add.Tensor, (x, 0.5)),
        "aten.sub.Tensor[scalar]": (aten.sub.Tensor, (x, 0.5)),
        "aten.mul.Tensor[scalar]": (aten.mul.Tensor, (x, 0.5)),
        "aten.div.Tensor[scalar]": (aten.div.Tensor, (x, 3.0)),
        "aten.mean.dim": (aten.mean.dim, (x, [-1], True)),
        "aten.sum.default": (aten.sum.default, (x,)),
        "aten.amax.default": (aten.amax.default, (x, [-1], True)),
        "aten.max.dim": (aten.max.dim, (x, -1, True)),
    }


def _call_bytes(op: Any, args: tuple) -> float:
    """Bytes the op's formula says one call moves (inputs read + outputs written)."""
    out = op(*args)
    tensors = [a for a in args if isinstance(a, torch.Tensor)] + [
        t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)
    ]
    return float(sum(t.numel() * t.element_size() for t in tensors))


def _loop_seconds(op: Any, args: tuple, key: str, loops: tuple[float, float]) -> float:
    """Seconds a call spends in TensorIterator loops beyond a contiguous op's single row and call."""
    if not key.startswith(
        (
            "aten.add",
            "aten.sub",
            "aten.mul",
            "aten.div",
            "aten.pow",
            "aten.neg",
            "aten.rsqrt",
            "aten.exp",
            "aten.clamp",
            "aten.silu",
            "aten.sigmoid",
            "aten.le",
            "aten.ge",
            "aten.where",
            "aten.masked_fill",
            "prims.convert",
            "pointwise",
        )
    ):
        return 0.0
    operands = [(tuple(a.shape), a.stride()) for a in args if isinstance(a, torch.Tensor)]
    rows, calls = tensor_iterator_loops(operands)
    return (max(rows - 1, 0) * loops[0] + max(calls - 1, 0) * loops[1]) * 1e-9


# calibration cases that reduce each of their rows x 64 inputs' rows to one output (see _kind_cases,
# _elementwise_cases): they pay the per-output reduction cost on top of their bytes
_ROW_REDUCTION_CASES = frozenset({"reduction", "aten.mean.dim", "aten.amax.default", "aten.max.dim"})


def measure_kinds(
    repeats: int,
    small_rows: int = 4,
    large_rows: int = 256,
    loops: tuple[float, float] = (0.0, 0.0),
    reduce_output_ns: float = 0.0,
) -> dict[str, tuple[float, float]]:
    """Per op kind and per common element-wise overload: (fixed seconds per call, bytes per second)
    from a call at two sizes. `loops` = (row, call) overheads in ns (`measure_loop_overheads`): the
    TensorIterator loop time a broadcast case spends is taken out before the rate is solved for, as
    is a row reduction's per-output time (`reduce_output_ns`, `measure_row_costs`)."""
    out = {}
    small = {**_kind_cases(small_rows), **_elementwise_cases(small_rows)}
    # the second size is cache-resident: the measured rate is the op's arithmetic and bookkeeping;
    # larger tensors are bounded by the cache/memory model as well (see DeviceProfile.op_time)
    large = {**_kind_cases(large_rows), **_elementwise_cases(large_rows)}
    for key in small:
        (op, args_small), (_, args_large) = small[key], large[key]
        per_output = reduce_output_ns * 1e-9 if key in _ROW_REDUCTION_CASES else 0.0
        t_small = (
            _batched_time(lambda: op(*args_small), 200, repeats)
            - _loop_seconds(op, args_small, key, loops)
            - (small_rows - 1) * per_output
        )
        t_large = (
            _batched_time(lambda: op(*args_large), 5, repeats)
            - _loop_seconds(op, args_large, key, loops)
            - (large_rows - 1) * per_output
        )
        b_small, b_large = _call_bytes(op, args_small), _call_bytes(op, args_large)
        rate = (b_large - b_small) / max(t_large - t_small, 1e-9)
        out[key] = (t_small, rate)
    return out


# the fused expert-parallel experts ops (trex/ops/ep_experts.py): measured at two row counts per expert, with the
# weights in transformers' own [E, out, in] layout (what the programs pass them as) and a DeepSeek-style width
EXPERT_OPS_SHAPE = {"experts": 8, "hidden": 512, "intermediate": 128, "rows_per_expert": (8, 64)}


def _expert_op_calls(rows_per_expert: int) -> dict[str, tuple[Any, tuple]]:
    """The three expert-parallel experts ops, one rank's received rows spread evenly over its experts, each with the
    arguments its graph gives it (the forward's saved tensors feed the two backward halves)."""
    import trex.ops  # noqa: F401 - registers torch.ops.trex.ep_experts_local*

    ops = torch.ops.trex
    experts, hidden, inter = (EXPERT_OPS_SHAPE[k] for k in ("experts", "hidden", "intermediate"))
    rows = experts * rows_per_expert
    generator = torch.Generator().manual_seed(0)
    received = torch.randn(rows, hidden, generator=generator)
    counts = torch.full((1, experts), rows_per_expert, dtype=torch.int64)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=generator) * 0.05  # [E, out, in]
    down = torch.randn(experts, hidden, inter, generator=generator) * 0.05
    forward = (received, counts, gate_up, down, "silu", 0.0, False, rows)
    _, regroup, grouped_in, gate_up_out = ops.ep_experts_local(*forward)
    grad = torch.randn(rows, hidden, generator=generator)
    data = (grad, counts, gate_up, down, regroup, gate_up_out, "silu", 0.0, False, rows)
    _, grad_local_out, grad_gate_up_out = ops.ep_experts_local_input_backward(*data)
    weight = (
        grad_local_out,
        counts,
        gate_up,
        down,
        grouped_in,
        gate_up_out,
        grad_gate_up_out,
        "silu",
        0.0,
        False,
        rows,
    )
    return {
        "trex.ep_experts_local": (ops.ep_experts_local.default, forward),
        "trex.ep_experts_local_input_backward": (ops.ep_experts_local_input_backward.default, data),
        "trex.ep_experts_local_weight_backward": (ops.ep_experts_local_weight_backward.default, weight),
    }


def traced_call(op: Any, args: tuple) -> Any:
    """The graph node of one call `op(*args)` (its tensor arguments traced, the rest kept as constants), with the
    shapes the cost model's formulas bind."""
    from torch.fx.experimental.proxy_tensor import make_fx

    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def call(*tensors):
        full = list(args)
        for i, t in zip(positions, tensors):
            full[i] = t
        return op(*full)

    graph = make_fx(call)(*(args[i] for i in positions)).graph
    (node,) = [n for n in graph.nodes if n.op == "call_function" and n.target is op]
    return node


def _modelled_parts(op: Any, args: tuple, profile: DeviceProfile) -> tuple[float, float]:
    """(seconds of the call's grouped GEMMs on `profile`'s tile model, bytes of its rows as its formula counts
    them): what `annotate` prices this call from, traced to a graph node."""
    from trex.cost_model.annotate import expert_gemm_seconds, expert_row_bytes
    from trex.cost_model.op_formulas import formula_for

    node = traced_call(op, args)
    formula = formula_for(node.target)
    values = formula.bind(node)
    _, moved = (float(x) for x in formula.evaluate(*[float(values.get(s, 0.0)) for s in formula.symbols]))
    name = str(op).rsplit(".", 1)[0]
    return expert_gemm_seconds(name, values, profile, "fp32"), expert_row_bytes(name, values, moved)


def measure_expert_ops(profile: DeviceProfile, repeats: int) -> dict[str, tuple[float, float]]:
    """Per expert-parallel experts op: (fixed seconds per call, bytes per second) of what the call takes beyond
    its grouped GEMMs as `profile`'s GEMM model prices them (the index build, the row gathers and scatter, the
    activation, reading the [E, out, in] weights through a transpose), from calls at two row counts
    (`EXPERT_OPS_SHAPE`): annotate then prices the op as its modelled GEMMs plus this line over its bytes, as
    `trex.grouped_mm`'s measured call is priced; the bytes are the rows' (`annotate.expert_row_bytes`: the
    weights are the GEMMs', and a larger model's weights would otherwise be charged at the rows' rate). Calls on operands in the cache, as every op of the calibration;
    `cache_residency` adds the reads a graph's order leaves cold."""
    small_rows, large_rows = EXPERT_OPS_SHAPE["rows_per_expert"]
    small, large = _expert_op_calls(small_rows), _expert_op_calls(large_rows)
    out = {}
    for key in small:
        points = []
        for op, args in (small[key], large[key]):
            seconds = _batched_time(lambda op=op, args=args: op(*args), 3, repeats)
            gemms, moved = _modelled_parts(op, args, profile)
            points.append((moved, max(seconds - gemms, 0.0)))
        (b_small, r_small), (b_large, r_large) = points
        # the line through both calls; a call costs at least one kernel's fixed cost (the profile's measured
        # per-op overhead), so where the line's intercept falls below it, the line runs from that cost through the
        # larger call (the smaller one then sits below it, the noise of a short call)
        floor = profile.kernel_overhead_s
        fixed = floor
        if r_large > r_small and b_large > b_small:
            fixed = max(r_small - b_small * (r_large - r_small) / (b_large - b_small), floor)
        rate = b_large / (r_large - fixed) if r_large > fixed else 1e15  # 1e15: no per-byte cost measurable
        out[key] = (fixed, rate)
    return out


def measure_loop_overheads(repeats: int, rows: int = 4096) -> tuple[float, float]:
    """(ns per inner row, ns per 2-D loop call) of CPU element-wise kernels, from two layouts with
    the bytes of a contiguous reference: the first two of four columns (rows of 2 that cannot
    coalesce: `rows` rows, one 2-D call) and a (rows/2, 2, 2) tensor divided by a (rows/2, 1, 2)
    broadcast over its middle dimension (2 rows per 2-D call: rows/2 calls)."""
    aten = torch.ops.aten
    wide_a, wide_b = torch.rand(rows, 4) + 0.5, torch.rand(rows, 4) + 0.5
    flat_a, flat_b = torch.rand(2 * rows) + 0.5, torch.rand(2 * rows) + 0.5
    contiguous = _batched_time(lambda: aten.mul.Tensor(flat_a, flat_b), 20, repeats)
    strided = _batched_time(lambda: aten.mul.Tensor(wide_a[:, :2], wide_b[:, :2]), 20, repeats)
    row_rows, _ = tensor_iterator_loops([((rows, 2), (4, 1)), ((rows, 2), (4, 1))])
    per_row = max(strided - contiguous, 0.0) / max(row_rows - 1, 1)
    cube, middle = torch.rand(rows // 2, 2, 2) + 0.5, torch.rand(rows // 2, 1, 2) + 0.5
    broadcast = _batched_time(lambda: aten.div.Tensor(cube, middle), 20, repeats)
    call_rows, calls = tensor_iterator_loops([((rows // 2, 2, 2), cube.stride()), ((rows // 2, 1, 2), middle.stride())])
    per_call = max(broadcast - contiguous - (call_rows - 1) * per_row, 0.0) / max(calls - 1, 1)
    return per_row * 1e9, per_call * 1e9


@dataclass
class RowCosts:
    """CPU row-wise kernel costs (`trex.cost_model.cpu_rows`)."""

    vector_lanes: int = 0
    scalar_softmax_ns: dict[str, float] = field(default_factory=dict)
    reduce_output_ns: dict[str, float] = field(default_factory=dict)


def measure_row_costs(repeats: int, elements: int = 1 << 14) -> RowCosts:
    """Softmax over rows of 2..64 and sums over short rows, all over `elements` fp32 values.

    The vector width is the shortest row whose softmax costs under a quarter per element of a row
    of 2 (the scalar fallback ends there); the scalar cost is the median per-element excess of the
    shorter rows over rows of 64. A reduction's per-output cost is the excess of summing rows of 2
    (contiguous: over the last dimension; strided: over the middle of (n, 2, 2)) over summing rows
    of 64, per extra output."""
    aten = torch.ops.aten
    lengths = (2, 4, 8, 16, 32, 64)
    per_element: dict[str, dict[int, float]] = {"forward": {}, "backward": {}}
    for length in lengths:
        x, grad = torch.rand(elements // length, length), torch.rand(elements // length, length)
        out = aten._softmax(x, -1, False)
        per_element["forward"][length] = _batched_time(lambda: aten._softmax(x, -1, False), 20, repeats) / elements
        per_element["backward"][length] = (
            _batched_time(lambda: aten._softmax_backward_data(grad, out, -1, torch.float32), 20, repeats) / elements
        )
    forward = per_element["forward"]
    lanes = next((length for length in lengths[1:] if forward[length] < 0.25 * forward[2]), 0)
    costs = RowCosts(vector_lanes=lanes)
    if lanes:
        for direction, times in per_element.items():
            short = sorted(times[length] for length in lengths if length < lanes)
            costs.scalar_softmax_ns[direction] = max(statistics.median(short) - times[64], 0.0) * 1e9
    rows = torch.rand(elements // 64, 64)
    baseline = _batched_time(lambda: aten.sum.dim_IntList(rows, [-1], True), 20, repeats)
    pairs, cube = torch.rand(elements // 2, 2), torch.rand(elements // 4, 2, 2)
    extra = elements // 2 - elements // 64
    contiguous = _batched_time(lambda: aten.sum.dim_IntList(pairs, [-1], True), 20, repeats)
    strided = _batched_time(lambda: aten.sum.dim_IntList(cube, [1], True), 20, repeats)
    costs.reduce_output_ns = {
        "contiguous": max(contiguous - baseline, 0.0) / extra * 1e9,
        "strided": max(strided - baseline, 0.0) / extra * 1e9,
    }
    return costs


def measure_vector(elements: int, repeats: int) -> float:
    """Element-wise arithmetic throughput (FLOP/s), from exp over a cache-resident buffer: the op
    formulas count a transcendental as 4 FLOPs, so the rate is in the same units they use."""
    x = torch.rand(elements)
    z = torch.empty(elements)
    seconds = _batched_time(lambda: torch.exp(x, out=z), 20, repeats)
    return 4.0 * elements / seconds


def measure_attention(shapes: list[tuple[int, int, int, int]], repeats: int) -> list[tuple[str, float, float]]:
    out = []
    for batch, heads, seq, dim in shapes:
        q, k, v = (torch.randn(batch, heads, seq, dim, requires_grad=True) for _ in range(3))
        flops = 2.0 * batch * heads * seq * seq * (2 * dim) * ((seq + 1) / (2 * seq))
        forward = best_time(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), repeats)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        grad = torch.randn_like(o)

        def backward() -> None:
            out_ = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(out_, (q, k, v), grad)

        both = best_time(backward, repeats)
        out.append(("forward", flops, forward))
        out.append(("backward", 2.5 * flops, max(both - forward, forward * 0.5)))
    return out


# ---------------------------------------------------------------------------------------------
# Collectives over gloo with two local processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collective_worker(
    rank: int, world: int, port: int, sizes: list[int], repeats: int, queue: Any, groups: tuple[int, ...] = (2,)
) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # as the runtime's ranks run (OMP_NUM_THREADS=1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = []
        for size in groups:
            # every rank creates every block's group (new_group is collective); the blocks then run at once, as
            # the runtime's groups of one kind (the dp groups of a tp plan) do
            blocks = [dist.new_group(list(range(start, start + size))) for start in range(0, world, size)]
            group = blocks[rank // size]
            for elements in sizes:
                x = torch.rand(elements)
                gathered = torch.empty(elements * size)
                part = max(1, elements // size)
                scattered = torch.empty(part)
                source = torch.rand(part * size)
                a2a_out = torch.empty(part * size)
                cases = {
                    "all_reduce": (lambda: dist.all_reduce(x, group=group), elements * 4.0),
                    "all_gather": (
                        lambda: dist.all_gather_into_tensor(gathered, x, group=group),
                        elements * size * 4.0,
                    ),
                    "reduce_scatter": (
                        lambda: dist.reduce_scatter_tensor(scattered, source, group=group),
                        source.numel() * 4.0,
                    ),
                    "all_to_all": (lambda: dist.all_to_all_single(a2a_out, source, group=group), source.numel() * 4.0),
                }
                for kind, (fn, nbytes) in cases.items():
                    dist.barrier()
                    try:
                        seconds = median_time(fn, repeats, warmup=2)
                    except RuntimeError:  # a backend without this collective: skip it
                        continue
                    results.append((kind, size, nbytes, seconds))
        if rank == 0:
            queue.put(results)
    finally:
        dist.destroy_process_group()


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> float:
    """The median of `repeats` calls: processes that share cores wait for each other's time slices, and a run
    meets the typical wait, not the luckiest (the minimum `best_time` takes for a kernel alone)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure_collectives(
    sizes: list[int], repeats: int, world: int = 2, timeout: float = 300.0, groups: tuple[int, ...] | None = None
) -> list[tuple[str, int, float, float]]:
    """(kind, group size, bytes, seconds) for each collective kind over gloo with `world` local processes,
    over groups of each size in `groups` (default: 2 and `world`) that tile the processes."""
    import torch.multiprocessing as mp

    groups = tuple(sorted({g for g in (groups or (2, world)) if 1 < g <= world and world % g == 0}))
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    processes = [
        context.Process(target=_collective_worker, args=(rank, world, port, sizes, repeats, queue, groups))
        for rank in range(world)
    ]
    for p in processes:
        p.start()
    try:
        results = queue.get(timeout=timeout)
    finally:
        for p in processes:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    return results


def fit_collectives(results: list[tuple[str, int, float, float]]) -> tuple[MeasuredCollective, ...]:
    """One latency + bytes / bandwidth line per (kind, group size), least squares over the sizes measured."""
    out = []
    for kind, group in sorted({(k, g) for k, g, _, _ in results}):
        points = [(nbytes, seconds) for k, g, nbytes, seconds in results if (k, g) == (kind, group)]
        if len(points) < 2:
            continue
        latency, slope = fit_line(points)
        out.append(MeasuredCollective(kind, group, latency * 1e6, 1.0 / slope / 1e9))
    return tuple(out)


def host_cores() -> int:
    """The cores this process may run on (its affinity mask), which local ranks share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------
# Fits


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of seconds against size; both clamped to be positive."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    n = len(points)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var if var else 0.0
    slope = max(slope, 1e-15)
    intercept = max(mean_y - slope * mean_x, min(ys) * 0.5, 1e-7)
    return intercept, slope


# Output tiles a CPU GEMM may be quantised to: BLAS micro-kernels block registers in a few rows by one
# or two vectors (e.g. AVX-512 fp32 kernels of 14-32 x 16-32), cache blocking in larger panels. The
# matmul ladder's small and skinny shapes decide which fits this machine's library.
_CPU_TILES = ((64, 64), (32, 32), (16, 16), (8, 16), (8, 8))


def _fit_gemm(matmul: list[tuple[str, int, int, int, float]], base: DeviceProfile) -> DeviceProfile:
    """Per dtype: the asymptotic peak and the fixed launch cost, with one output tile and one `k_fill`
    shared by all, minimising the squared log-time error over the measured shapes (a grid search)."""
    dtypes = sorted({d for d, *_ in matmul})
    best_rate = {d: max(2.0 * m * n * k / s for dd, m, n, k, s in matmul if dd == d) for d in dtypes}
    fastest = {d: min(s for dd, *_, s in matmul if dd == d) for d in dtypes}
    multipliers = [1.0 + 0.05 * i for i in range(41)]  # peak between 1x and 3x the best measured rate
    launches = (0.05, 0.25, 0.5, 0.75, 0.9)  # fixed cost as a fraction of the fastest call
    best_fit, best_error = base, math.inf
    for (tile_m, tile_n), k_fill in itertools.product(_CPU_TILES, (0.0, 8.0, 16.0, 32.0, 64.0, 128.0)):
        peaks, launch, error = {}, {}, 0.0
        for d in dtypes:
            points = [(m, n, k, s) for dd, m, n, k, s in matmul if dd == d]
            choice, choice_error = (best_rate[d], fastest[d] * 0.5), math.inf
            for factor in multipliers:
                for share in launches:
                    gemm = replace(
                        base.gemm,
                        tile_m=tile_m,
                        tile_n=tile_n,
                        k_fill=k_fill,
                        efficiency={d: 1.0},
                        launch_us={d: fastest[d] * share * 1e6},
                    )
                    candidate = replace(base, peak_tflops={d: best_rate[d] * factor / 1e12}, gemm=gemm)
                    e = sum(
                        (math.log(candidate.gemm_time(m, n, k, d, out_bytes=4.0 if d == "fp32" else 2.0)) - math.log(s))
                        ** 2
                        for m, n, k, s in points
                    )
                    if e < choice_error:
                        choice, choice_error = (best_rate[d] * factor, fastest[d] * share), e
            peaks[d], launch[d] = choice[0] / 1e12, choice[1] * 1e6
            error += choice_error
        if error < best_error:
            gemm = replace(
                base.gemm,
                tile_m=tile_m,
                tile_n=tile_n,
                k_fill=k_fill,
                efficiency={d: 1.0 for d in dtypes},
                launch_us=launch,
            )
            best_fit, best_error = replace(base, peak_tflops=peaks, gemm=gemm), error
    return best_fit


def calibrate(fast: bool = False, collectives: bool = True, threads: int | None = None, ranks: int = 2) -> Calibration:
    """Measure this machine (see module docstring) and return the fitted profile and tier.

    threads: intra-op threads to measure with (default: torch's current setting). On a machine
    other processes share, fewer threads than cores avoids timing the OS scheduler instead of the
    kernels (an OpenMP barrier waits a whole time slice for a descheduled thread).
    ranks: local processes the gloo collectives are timed with (groups of 2 and of `ranks`), as many as the
    runs to be predicted start: processes that share the cores slow each other's collectives.
    """
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _calibrate(fast, collectives, ranks)
    finally:
        torch.set_num_threads(previous)


def _calibrate(fast: bool, collectives: bool, ranks: int = 2) -> Calibration:
    started = time.perf_counter()
    threads = torch.get_num_threads()
    repeats = 3 if fast else 7
    if fast:
        shapes = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (256, 64, 256), (4, 64, 64), (512, 8, 64)]
        copy_sizes = [1 << 20, 1 << 22]
        pointwise_sizes = [1, 1 << 10, 1 << 12, 1 << 14, 1 << 20, 1 << 21]
        attention_shapes = [(1, 2, 64, 32)]
        collective_sizes = [256, 1 << 16]
    else:
        shapes = (
            [(s, s, s) for s in (64, 128, 256, 512, 1024, 2048)]
            + [(2048, 256, 2048), (256, 2048, 2048), (4096, 512, 512), (512, 512, 4096)]
            + [
                (512, 64, 64),
                (512, 128, 64),
                (512, 64, 256),
                (2048, 64, 64),
                (128, 512, 64),
                (64, 64, 2048),
            ]  # skinny, short-K
            + [(2, 64, 64), (4, 256, 64), (8, 512, 128), (512, 4, 64), (24, 24, 256), (40, 40, 128)]
        )  # fewer rows/columns than a tile
        copy_sizes = [1 << 22, 1 << 24, 1 << 26]
        pointwise_sizes = [1, 1 << 8, 1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 20, 1 << 22, 1 << 24]
        attention_shapes = [(1, 4, 256, 64), (1, 8, 512, 64), (2, 8, 1024, 64)]
        collective_sizes = [64, 1 << 12, 1 << 16, 1 << 20, 1 << 22]
    base = DeviceProfile(
        name="cpu",
        description=f"{_cpu_name()}, {threads} threads (calibrated {time.strftime('%Y-%m-%d')})",
        peak_tflops={"fp32": 0.1},
        memory_gib=_memory_gib(),
        hbm_bandwidth_gbs=10.0,
        gemm=GemmModel(
            compute_units=threads,
            efficiency={"fp32": 1.0},
            tile_m=64,
            tile_n=64,
            k_fill=32.0,
            launch_per_group=True,  # torch's CPU grouped GEMM is an mm per group
        ),
        attention=AttentionModel(0.5, 0.4, 64.0, block=0.0),
        memory_efficiency=1.0,
        kernel_overhead_us=5.0,
        reserved_memory_gib=1.0,
        sources=("measured by `trex calibrate` on this machine",),
        calibrated=True,
    )
    copies = measure_copy(copy_sizes, repeats)
    bandwidth = max(nbytes / seconds for nbytes, seconds in copies)
    # Without the collective measurements (collectives=False) the tier keeps what is known: loopback
    # traffic cannot beat the memory bandwidth just measured; the latency stays the uncalibrated default.
    unmeasured = Tier(
        "gloo-loopback",
        None,
        bandwidth / 1e9,
        UNCALIBRATED_GLOO_LATENCY_US,
        1.0,
        "switch",
        "not measured (collectives skipped): bandwidth bounded by the measured memory copy bandwidth, "
        "latency the uncalibrated default",
    )
    result = Calibration(profile=base, tier=unmeasured)
    result.copy = copies
    result.pointwise = measure_pointwise(pointwise_sizes, repeats)
    cache = _cache_bytes()
    in_cache = [p for p in result.pointwise if p[0] <= cache / 2]
    beyond = [p for p in result.pointwise if p[0] >= 2 * cache] or result.pointwise[-2:]
    overhead, cache_slope = fit_line(in_cache) if len(in_cache) >= 2 else fit_line(result.pointwise)
    _, slope = fit_line(beyond) if len(beyond) >= 2 else (overhead, 1.0 / bandwidth)
    pointwise_bandwidth = 1.0 / slope
    result.matmul = measure_matmul(shapes, ("fp32", "bf16"), repeats)
    profile = replace(
        base,
        hbm_bandwidth_gbs=bandwidth / 1e9,
        memory_efficiency=min(1.0, pointwise_bandwidth / bandwidth),
        kernel_overhead_us=overhead * 1e6,
        cache_mib=cache / 2**20,
        cache_bandwidth_gbs=max(1.0 / cache_slope, pointwise_bandwidth) / 1e9,
    )
    profile = _fit_gemm(result.matmul, profile)
    result.loops = measure_loop_overheads(repeats)
    result.rows = measure_row_costs(repeats)
    result.kinds = measure_kinds(
        repeats, loops=result.loops, reduce_output_ns=result.rows.reduce_output_ns.get("contiguous", 0.0)
    )
    result.kinds.update(measure_expert_ops(profile, repeats))
    result.vector_flops = measure_vector(1 << 16, repeats)
    profile = replace(
        profile,
        op_overhead_us={key: fixed * 1e6 for key, (fixed, _) in result.kinds.items()},
        op_bandwidth_gbs={key: rate / 1e9 for key, (_, rate) in result.kinds.items()},
        vector_tflops=result.vector_flops / 1e12,
        row_overhead_ns=result.loops[0],
        loop_call_overhead_ns=result.loops[1],
        vector_lanes=result.rows.vector_lanes,
        scalar_softmax_ns=result.rows.scalar_softmax_ns,
        reduce_output_ns=result.rows.reduce_output_ns,
    )
    result.attention = measure_attention(attention_shapes, repeats)
    fp32 = profile.peak_flops("fp32")
    forward = [flops / seconds / fp32 for direction, flops, seconds in result.attention if direction == "forward"]
    backward = [flops / seconds / fp32 for direction, flops, seconds in result.attention if direction == "backward"]
    half_keys = 64.0
    # attention_time charges the BF16 peak; express the measured fp32 efficiencies against it
    scale = fp32 / profile.peak_flops("bf16") if profile.supports("bf16") else 1.0
    profile = replace(
        profile,
        attention=AttentionModel(
            min(1.0, max(forward) * scale * (1 + half_keys / 256)),
            min(1.0, max(backward) * scale * (1 + half_keys / 256)),
            half_keys,
            block=0.0,
        ),
    )  # measured against the triangle's FLOPs
    result.profile = profile
    if collectives:
        result.collectives = measure_collectives(collective_sizes, repeats, world=max(2, ranks))
        reduce_points = [(b, sec) for kind, g, b, sec in result.collectives if kind == "all_reduce" and g == 2]
        latency, slope = fit_line(reduce_points)
        # ring all_reduce over 2 ranks: 2 steps of latency, 2*(1/2) n / B of traffic; loopback
        # traffic cannot beat the memory bandwidth measured above. Groups of a measured size use their
        # kind's own line (`Tier.collectives`); the ring formula prices the others.
        link = min(1.0 / slope, bandwidth)
        result.tier = Tier(
            "gloo-loopback",
            None,
            bandwidth_gbs=link / 1e9,
            latency_us=latency / 2 * 1e6,
            efficiency=1.0,
            topology="switch",
            source=f"measured by `trex calibrate`: each collective kind over gloo, {max(2, ranks)} local processes",
            collectives=fit_collectives(result.collectives),
        )
        # an eager rank's issue costs (plain op, DTensor op, FSDP2 unit): a process of its own with a fake group
        result.eager = measure_eager_costs_apart(repeats)
        if "error" not in result.eager:
            result.profile = replace(
                result.profile,
                eager_op_us=result.eager["eager_op_us"],
                dtensor_op_us=result.eager["dtensor_op_us"],
                fsdp_unit_us=result.eager["fsdp_unit_us"],
            )
    result.seconds = time.perf_counter() - started
    return result


def _cache_bytes() -> float:
    """Per-core cache capacity (the level-2 cache from sysfs; 1 MiB when unknown)."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(base.glob("index*")):
            if (index / "level").read_text().strip() == "2":
                text = (index / "size").read_text().strip().upper()
                unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1], 1)
                return float(text.rstrip("KMG")) * unit
    except (OSError, ValueError):
        pass
    return float(2**20)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


def _memory_gib() -> float:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return round(pages / 1024**3, 1)
    except (ValueError, OSError, AttributeError):
        return 8.0


def save_calibration(result: Calibration, path: str | Path | None = None) -> Path:
    """Write the profile and its gloo tier as one file (TOML, or JSON by suffix); `cpu` loads it."""
    import json

    from trex.cost_model.toml_writer import dumps

    path = Path(path) if path else calibrated_cpu_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = cluster_to_dict(result.cluster())
    data["measurements"] = {
        "matmul": [f"{d} {m}x{n}x{k}: {s * 1e6:.1f} us" for d, m, n, k, s in result.matmul],
        "copy": [f"{b / 1e6:.1f} MB: {s * 1e6:.1f} us" for b, s in result.copy],
        "pointwise": [f"{b / 1e3:.1f} kB: {s * 1e6:.2f} us" for b, s in result.pointwise],
        "attention": [f"{d} {f / 1e6:.1f} MFLOP: {s * 1e6:.1f} us" for d, f, s in result.attention],
        "collectives": [f"{k} over {g}: {b / 1e3:.1f} kB: {s * 1e6:.1f} us" for k, g, b, s in result.collectives],
        "op_kinds": [
            f"{k}: {fixed * 1e6:.2f} us + bytes / {rate / 1e9:.2f} GB/s" for k, (fixed, rate) in result.kinds.items()
        ],
        "element_wise_loops": f"{result.loops[0]:.2f} ns per row, {result.loops[1]:.2f} ns per 2-D loop call",
        "row_kernels": (
            f"{result.rows.vector_lanes} fp32 lanes; scalar softmax "
            + ", ".join(f"{k} {v:.1f}" for k, v in result.rows.scalar_softmax_ns.items())
            + " ns per element; reduction "
            + ", ".join(f"{k} {v:.1f}" for k, v in result.rows.reduce_output_ns.items())
            + " ns per output"
        )
        if result.rows
        else "not measured",
        "eager_issue": {key: str(value) for key, value in result.eager.items()},
        "seconds": result.seconds,
    }
    path.write_text(json.dumps(data, indent=2) + "\n" if path.suffix == ".json" else dumps(data))
    return path
