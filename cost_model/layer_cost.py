"""Time, FLOPs and saved memory of one layer for one micro-batch on one device, under a plan.

This is the inner loop of the planner, so it is plain float arithmetic over the few layer kinds of a
model (DeepSeek-V4 has four), priced once per plan. What each part costs:

* GEMMs - `DeviceProfile.gemm_time` (tile-wave model) for the forward, the data gradient and the
  weight gradient, on the shard tensor parallelism leaves (column: N/tp, row: K/tp, replicated:
  the whole GEMM on every TP rank, sequence: the sequence-parallel shard). FP8 GEMMs also pay the
  quantisation kernels around them.
* attention cores - fused (flash) kernels priced by `attention_time` over the keys each query
  really visits (causal blocks on the diagonal included); `unfused` (Megatron 2022) runs QK^T and
  PV as batched GEMMs over the full seq x seq square plus the softmax/dropout traffic on it.
* MoE - grouped GEMMs over the rows routed to this device's experts (uniform routing times
  `moe_imbalance`), permutation kernels, and dispatch/combine all-to-alls over the EP group. The
  `deepep` dispatcher sends a token once per destination node (node-level deduplication).
* memory-bound kernels - bytes / achievable HBM bandwidth + per-kernel overhead; backward moves
  twice the forward bytes.
* tensor-parallel collectives (sequence parallel: all-gather + reduce-scatter per region, mirrored
  in the backward) exposed unless `tp_comm_overlap`, which hides them under the tensor-parallel GEMMs
  and runs the forward and row-parallel data-gradient GEMMs as tp sub-GEMMs (ring exchange);
  context-parallel ring exchange of K/V overlapped with the attention it feeds.
* recompute - selective modules re-run their forward inside the backward; full recompute re-runs
  the whole forward, collectives included, and keeps only the layer input.
* host - the time the host takes to issue the layer's ops (captured op counts x the profile's
  per-op cost) and whether its forward synchronises with the device; `step` sets them against
  the device times (`trex.cost_model.host`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trex.cost_model import collectives
from trex.cost_model.cluster import Cluster, Placement
from trex.cost_model.devices import DTYPE_BYTES, DeviceProfile
from trex.cost_model.model_spec import AttentionCore, LayerSpec, Linear, ModelSpec, MoESpec
from trex.cost_model.parallel import ParallelConfig, RankLayout


@dataclass(frozen=True)
class OpTime:
    """One priced part of a layer (for traces and explanations)."""

    name: str
    category: str  # gemm | attention | moe_gemm | pointwise | tp_comm | ep_comm | cp_comm | overlap (compute slowed by hidden comm)
    forward_s: float
    backward_s: float
    recompute_s: float = 0.0
    flops: float = 0.0  # executed, forward + backward (+ recompute)
    # GEMM operand bytes (A and B read, C written once, at the GEMM's dtype) of the GEMMs this op runs,
    # forward + backward (+ recompute); memory-bound kernels: the bytes they move. 0 where the op is priced
    # by FLOPs alone (fused attention) or moves nothing on this device. `trex.cost_model.agreement` checks
    # these against the annotated graph.
    bytes: float = 0.0

    def to_dict(self) -> dict[str, float | str]:
        executed = self.forward_s + self.backward_s + self.recompute_s
        return {
            "name": self.name,
            "category": self.category,
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "recompute_s": self.recompute_s,
            "flops": self.flops,
            "bytes": self.bytes,
            "tflops": self.flops / executed / 1e12 if self.flops and executed else None,
        }


@dataclass
class LayerCost:
    forward_s: float = 0.0  # compute only
    backward_s: float = 0.0
    recompute_s: float = 0.0
    comm_forward_s: float = 0.0  # exposed communication inside the forward
    comm_backward_s: float = 0.0  # exposed communication inside the backward (incl. recompute's)
    comm_total_s: float = 0.0  # all communication before overlap (for reports)
    saved_bytes: float = 0.0  # activations kept from forward to backward, one micro-batch
    transient_bytes: float = 0.0  # extra peak while this layer runs its backward
    flops: float = 0.0  # executed FLOPs, forward + backward + recompute
    ops: list[OpTime] = field(default_factory=list)
    host_forward_s: float = 0.0  # host time to issue the forward's ops (trex.cost_model.host)
    host_backward_s: float = 0.0  # ... the backward's, recompute included
    syncs_host: bool = False  # the forward waits for the device once (dropless MoE token counts)
    tp_gemm_forward_s: float = 0.0  # tensor-parallel GEMMs: the window an overlapped TP collective hides in
    tp_gemm_backward_s: float = 0.0

    @property
    def device_forward_s(self) -> float:
        """What the device's stream runs in the forward: compute and the communication it waits for."""
        return self.forward_s + self.comm_forward_s

    @property
    def device_backward_s(self) -> float:
        return self.backward_s + self.recompute_s + self.comm_backward_s

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s

    @property
    def comm_s(self) -> float:
        return self.comm_forward_s + self.comm_backward_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s

    def to_dict(self) -> dict[str, object]:
        """Times of one micro-batch on one device; `ops` only when priced with detail."""
        return {
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "recompute_s": self.recompute_s,
            "exposed_comm_forward_s": self.comm_forward_s,
            "exposed_comm_backward_s": self.comm_backward_s,
            "comm_before_overlap_s": self.comm_total_s,
            "flops": self.flops,
            "saved_bytes": self.saved_bytes,
            "host_forward_s": self.host_forward_s,
            "host_backward_s": self.host_backward_s,
            "syncs_host": self.syncs_host,
            "ops": [op.to_dict() for op in self.ops],
        }

    def add(self, other: LayerCost) -> None:
        self.forward_s += other.forward_s
        self.backward_s += other.backward_s
        self.recompute_s += other.recompute_s
        self.comm_forward_s += other.comm_forward_s
        self.comm_backward_s += other.comm_backward_s
        self.comm_total_s += other.comm_total_s
        self.saved_bytes += other.saved_bytes
        self.transient_bytes = max(self.transient_bytes, other.transient_bytes)
        self.flops += other.flops
        self.ops.extend(other.ops)
        self.host_forward_s += other.host_forward_s
        self.host_backward_s += other.host_backward_s
        self.syncs_host = self.syncs_host or other.syncs_host
        self.tp_gemm_forward_s += other.tp_gemm_forward_s
        self.tp_gemm_backward_s += other.tp_gemm_backward_s


@dataclass(frozen=True)
class CostContext:
    """Everything about (plan, cluster) that layer costing needs, computed once per estimate."""

    plan: ParallelConfig
    device: DeviceProfile
    cluster: Cluster
    tokens: int  # tokens of one micro-batch on one device's sequence shard before SP: mbs*seq/cp
    tp: Placement
    cp: Placement
    ep: Placement
    etp: Placement
    detail: bool = False

    @classmethod
    def of(cls, plan: ParallelConfig, cluster: Cluster, detail: bool = False) -> CostContext:
        layout = RankLayout.of(plan)

        def place(kind: str) -> Placement:
            size, stride = layout.groups[kind]
            return cluster.strided_placement(size, stride)

        return cls(
            plan,
            cluster.device,
            cluster,
            plan.mbs * plan.seq // plan.cp,
            place("tp"),
            place("cp"),
            place("ep"),
            place("etp"),
            detail,
        )

    @property
    def sp_tokens(self) -> float:
        """Tokens per device on a sequence-parallel shard."""
        return self.tokens / self.plan.tp if self.plan.sequence_parallel else float(self.tokens)

    @property
    def wgrad_out_bytes(self) -> float:
        """Weight-gradient GEMMs accumulate into the main-gradient buffer: read + write per element."""
        return 2.0 * DTYPE_BYTES[self.plan.grad_dtype]

    @property
    def activation_dtype(self) -> str:
        return "fp32" if self.plan.precision == "fp32" else "bf16"

    @property
    def activation_scale(self) -> float:
        """Saved-activation sizes in the model spec are per BF16 element (`model_spec.A`); an FP32 run keeps
        every activation at 4 bytes, twice that."""
        return DTYPE_BYTES[self.activation_dtype] / 2.0

    @property
    def fp8_split_backward(self) -> bool:
        """Per-tensor FP8 recipes run the data- and weight-gradient GEMMs with split accumulation."""
        return self.plan.precision == "fp8" and self.plan.fp8_recipe in ("delayed", "tensorwise")

    @property
    def fp8_amax_pass(self) -> bool:
        """Current scaling (tensorwise) reads a tensor once for its amax before the cast reads it again
        (Transformer Engine docs, FP8 delayed scaling: "FP8 Current Scaling requires two tensor reads per
        quantization"); delayed scaling takes the scale from the amax history, blockwise computes each
        block's scale inside the cast kernel."""
        return self.plan.precision == "fp8" and self.plan.fp8_recipe == "tensorwise"

    def fp8_quantize_time(self, elements: float, sequence_parallel_input: bool) -> float:
        """Cast `elements` BF16 values to FP8 (read 2 + write 1 bytes each; + 2 for a current-scaling amax
        pass). A current-scaling quantizer of a sequence-parallel tensor all-reduces its amax over the TP
        group first (TE sets `with_amax_reduction` for those), a latency-bound collective on the way."""
        amax = self.fp8_amax_pass
        seconds = self.device.memory_time((5.0 if amax else 3.0) * elements, 2 if amax else 1)
        if amax and sequence_parallel_input and self.plan.tp > 1 and self.plan.sequence_parallel:
            seconds += collectives.all_reduce(4.0, self.tp)
        return seconds

    def gemm_dtype(self, linear_fp8: bool, fixed: str = "") -> str:
        if fixed:  # the layer computes this GEMM in its own dtype (Linear.dtype)
            return fixed
        if self.plan.precision == "fp8":
            return "fp8" if linear_fp8 else "bf16"
        return self.plan.precision


def gemm_operand_bytes(m: float, n: float, k: float, dtype: str, groups: float = 1) -> float:
    """Bytes a [m,k] @ [k,n] GEMM (`groups` of them) reads and writes: A and B once, C once, at `dtype`.

    The tile model's traffic (`DeviceProfile.gemm_time`) differs only for weight gradients that
    accumulate into an FP32 main-gradient buffer (read + write of C); the operand count is what a
    captured graph, which returns fresh gradients, can be checked against."""
    return groups * (m * k + k * n + m * n) * DTYPE_BYTES[dtype]


def _linear(lin: Linear, ctx: CostContext, cost: LayerCost, recompute: bool) -> None:
    tp = ctx.plan.tp
    tokens = ctx.tokens
    groups = lin.groups
    m, n, k = float(tokens), float(lin.out_features), float(lin.in_features)
    if lin.parallel == "column":
        if groups > 1 and groups % tp == 0:
            groups //= tp
        else:
            n /= tp
    elif lin.parallel == "row":
        k /= tp
    elif lin.parallel == "sequence":
        m = ctx.sp_tokens
    dtype = ctx.gemm_dtype(lin.fp8, lin.dtype)
    device = ctx.device
    sharded = tp > 1 and lin.parallel in ("column", "row")
    # TP communication overlap (Transformer Engine userbuffers, ring exchange): the all-gather before a
    # column-parallel GEMM and the reduce-scatter after a row-parallel one are pipelined with the GEMM,
    # which runs as tp sub-GEMMs of m/tp rows, one per peer's shard. The same holds for the row-parallel
    # data gradient (the all-gather of the incoming gradient); the column-parallel data gradient and the
    # weight gradients overlap whole ("bulk"). Sub-GEMMs of few rows fill the device less.
    ring = sharded and ctx.plan.tp_comm_overlap and ctx.plan.sequence_parallel
    chunks = tp if ring else 1
    forward = chunks * device.gemm_time(m / chunks, n, k, dtype, groups)
    dgrad_chunks = chunks if lin.parallel == "row" else 1
    split = ctx.fp8_split_backward
    backward = 0.0
    if lin.backward:  # data gradient, weight gradient
        backward = dgrad_chunks * device.gemm_time(
            m / dgrad_chunks, k, n, dtype, groups, split_accumulation=split
        ) + device.gemm_time(k, n, m, dtype, groups, ctx.wgrad_out_bytes, split_accumulation=split)
    if sharded:
        cost.tp_gemm_forward_s += forward
        cost.tp_gemm_backward_s += backward
    if dtype == "fp8":  # quantise the input (forward) and the incoming gradient + input transpose (backward)
        forward += ctx.fp8_quantize_time(m * k * groups, sharded and lin.parallel == "column")
        if lin.backward:
            backward += ctx.fp8_quantize_time(m * n * groups, sharded and lin.parallel == "row") + device.memory_time(
                3.0 * m * k * groups, 1
            )
    flops = 2.0 * m * n * k * groups
    recompute = recompute and lin.backward  # nothing of a forward-only GEMM is kept for a backward
    runs = (3 if lin.backward else 1) + (1 if recompute else 0)  # forward, data and weight gradients, recompute
    redo = forward if recompute else 0.0
    cost.forward_s += forward
    cost.backward_s += backward
    cost.recompute_s += redo
    cost.flops += flops * runs
    if ctx.detail:
        # forward [m,k]@[k,n], data gradient [m,n]@[n,k] and weight gradient [k,m]@[m,n]: the same three
        # matrices each time (the ring's sub-GEMMs read the weight once per chunk)
        nbytes = chunks * (1 + (1 if recompute else 0)) * gemm_operand_bytes(m / chunks, n, k, dtype, groups)
        if lin.backward:  # data gradient (ring sub-GEMMs when row-parallel) and weight gradient (whole)
            nbytes += dgrad_chunks * gemm_operand_bytes(m / dgrad_chunks, n, k, dtype, groups) + gemm_operand_bytes(
                m, n, k, dtype, groups
            )
        cost.ops.append(OpTime(lin.name, "gemm", forward, backward, redo, flops * runs, nbytes))


def _heads_on_device(core: AttentionCore, tp: int) -> float:
    return core.heads / tp if core.heads % tp == 0 else float(core.heads)


def _attention(core: AttentionCore, ctx: CostContext, cost: LayerCost, recompute: bool) -> None:
    plan, device = ctx.plan, ctx.device
    heads = _heads_on_device(core, plan.tp)
    tokens = ctx.tokens  # queries on this device (CP shard)
    seq = plan.seq
    dense_causal = core.causal and core.window is None and not core.compress_rate
    # Unfused attention (batched GEMMs, then a masked softmax) computes every score of the square and
    # applies the mask afterwards, whatever the mask is: a sliding window or compressed entries save
    # nothing without a kernel that skips masked blocks (transformers' eager attention is this path).
    unfused = plan.attention_kernel == "unfused"
    if unfused:
        keys = core.key_length(seq)
    else:
        # a causal square: whole blocks on the diagonal (`AttentionModel.causal_keys`, as annotate counts it)
        keys = device.attention.causal_keys(seq) if dense_causal else core.keys_per_query(seq)
    dims = core.qk_head_dim + core.v_head_dim
    forward_flops = 2.0 * tokens * heads * keys * dims
    # Fused kernels recompute the scores in the backward (FlashAttention-2, Dao 2023: dV, dP, dS, dQ, dK
    # plus S again: 5 GEMMs vs the forward's 2); unfused attention keeps P and runs the 2 x 2 gradient GEMMs
    # of QK^T and PV only (dQ, dK; dP, dV). A score-only core (v_head_dim 0) has 1 forward GEMM, 2 backward.
    backward_flops = forward_flops * (2.5 if core.v_head_dim and not unfused else 2.0) if core.backward else 0.0
    recompute = recompute and core.backward
    runs = (3 if core.backward else 1) + (1 if recompute else 0)  # forward, the backward's two GEMM pairs, recompute
    operand_bytes = 0.0
    if unfused:
        batch = max(1, round(plan.mbs * heads))
        rows = tokens / plan.mbs
        forward = device.gemm_time(rows, keys, core.qk_head_dim, "bf16", batch) + device.gemm_time(
            rows, core.v_head_dim, keys, "bf16", batch
        )
        backward = 2 * forward if core.backward else 0.0
        # QK^T and PV forward; each backward GEMM pair (dQ, dK; dP, dV) reads and writes the same matrices again
        scores = gemm_operand_bytes(rows, keys, core.qk_head_dim, "bf16", batch)
        values = gemm_operand_bytes(rows, core.v_head_dim, keys, "bf16", batch) if core.v_head_dim else 0.0
        operand_bytes = runs * (scores + values)
        elements = plan.mbs * heads * rows * keys
        per_element = 9.0 if core.dropout else 4.0  # scale-mask-softmax r/w (+ dropout r/w and its mask)
        forward += device.memory_time(per_element * elements, 2 if core.dropout else 1)
        backward += device.memory_time(2 * per_element * elements, 2 if core.dropout else 1) if core.backward else 0.0
        stored = (5.0 if core.dropout else 2.0) * elements * ctx.activation_scale if core.backward else 0.0
    else:
        forward = device.attention_time(forward_flops, keys, backward=False)
        backward = device.attention_time(backward_flops, keys, backward=True)
        stored = 4.0 * heads * tokens if core.backward else 0.0  # log-sum-exp per query and head (fp32)
    redo = forward if recompute else 0.0
    cost.forward_s += forward
    cost.backward_s += backward
    cost.recompute_s += redo
    if not recompute:
        cost.saved_bytes += stored
    cost.flops += forward_flops * (2 if recompute else 1) + backward_flops
    comm = 0.0
    if plan.cp > 1:  # ring attention: each rank receives every other rank's K and V (and dK, dV back)
        kv_heads = core.kv_heads / plan.tp if core.kv_heads % plan.tp == 0 else float(core.kv_heads)
        kv_bytes = plan.mbs * seq * kv_heads * dims * 2.0 * (plan.cp - 1) / plan.cp
        ring_f = collectives.all_gather(kv_bytes * plan.cp / (plan.cp - 1), ctx.cp)
        exposed_f = max(0.0, ring_f - forward)
        exposed_b = max(0.0, 2 * ring_f - backward)
        cost.comm_forward_s += exposed_f
        cost.comm_backward_s += exposed_b + (exposed_f if recompute else 0.0)
        cost.comm_total_s += 3 * ring_f
        comm = exposed_f + exposed_b
    if ctx.detail:
        executed = forward_flops * (2 if recompute else 1) + backward_flops
        cost.ops.append(OpTime(core.name, "attention", forward, backward, redo, executed, operand_bytes))
        if comm:
            cost.ops.append(
                OpTime(f"{core.name}.cp_ring", "cp_comm", exposed_f, exposed_b + (exposed_f if recompute else 0.0), 0.0)
            )


def _expected_nodes_hit(nodes: int, top_k: int, moe: MoESpec, ep: int) -> float:
    """Distinct nodes a token's top-k experts live on (uniform routing; group-limited if set)."""
    if nodes <= 1:
        return 1.0
    candidate = float(nodes)
    if moe.num_groups and moe.topk_groups and moe.num_groups >= nodes and moe.num_groups % nodes == 0:
        per_node = moe.num_groups // nodes
        miss = math.comb(moe.num_groups - per_node, moe.topk_groups) / math.comb(moe.num_groups, moe.topk_groups)
        candidate = nodes * (1.0 - miss)
    return candidate * (1.0 - (1.0 - 1.0 / candidate) ** top_k)


def _dispatch_time(moe: MoESpec, hidden: int, ctx: CostContext, rows_per_token: float) -> tuple[float, float]:
    """(seconds, bytes) of one dispatch (or combine) all-to-all of BF16 token rows over the EP group."""
    plan = ctx.plan
    tokens = ctx.sp_tokens
    per_rank = tokens * moe.top_k * hidden * 2.0 * rows_per_token
    placement = ctx.ep
    if placement.size <= 1:
        return 0.0, 0.0
    if plan.dispatcher == "deepep" and len(placement.levels) > 1:
        inner = placement.levels[0]
        nodes = placement.size // inner.fanout
        hit = _expected_nodes_hit(nodes, moe.top_k, moe, plan.ep)
        remote_nodes = hit * (nodes - 1) / nodes
        outer_bytes = tokens * remote_nodes * hidden * 2.0 * rows_per_token
        inner_bytes = per_rank * (inner.fanout - 1) / inner.fanout  # forwarding to the GPUs holding the experts
        seconds = max(
            collectives.tier_transfer(level.tier, b, level.fanout - 1)
            for level, b in ((placement.levels[-1], outer_bytes), (inner, inner_bytes))
        )
        return seconds, outer_bytes + inner_bytes
    return collectives.all_to_all(per_rank, placement), per_rank * (placement.size - 1) / placement.size


def _moe(moe: MoESpec, hidden: int, ctx: CostContext, cost: LayerCost, modules: frozenset[str], full: bool) -> None:
    plan, device = ctx.plan, ctx.device
    local_experts = moe.num_experts // plan.ep
    rows = ctx.sp_tokens * moe.top_k * plan.etp * plan.moe_imbalance
    per_expert = rows / local_experts
    dtype = ctx.gemm_dtype(True)
    redo_experts = full or "moe" in modules
    forward = backward = 0.0
    flops = 0.0
    operand_bytes = 0.0
    for n, k in ((moe.fc1_out / plan.etp, hidden), (hidden, moe.expert_ffn / plan.etp)):
        operand_bytes += gemm_operand_bytes(per_expert, n, k, dtype, local_experts) * (4 if redo_experts else 3)
        split = ctx.fp8_split_backward
        f = device.gemm_time(per_expert, n, k, dtype, local_experts)
        b = device.gemm_time(per_expert, k, n, dtype, local_experts, split_accumulation=split) + device.gemm_time(
            k, n, per_expert, dtype, local_experts, ctx.wgrad_out_bytes, split_accumulation=split
        )
        if dtype == "fp8":
            f += ctx.fp8_quantize_time(rows * k, False)
            b += ctx.fp8_quantize_time(rows * n, False) + device.memory_time(3.0 * rows * k, 1)
        forward += f
        backward += b
        flops += 2.0 * rows * n * k
    redo = forward if redo_experts else 0.0
    cost.forward_s += forward
    cost.backward_s += backward
    cost.recompute_s += redo
    cost.flops += flops * (4 if redo_experts else 3)
    # dispatch + combine forward; their mirror images backward; again in the recompute
    a2a, _ = _dispatch_time(moe, hidden, ctx, plan.moe_imbalance)
    etp_comm = 0.0
    if plan.etp > 1:
        etp_bytes = rows * hidden * 2.0
        etp_comm = collectives.all_gather(etp_bytes, ctx.etp) + collectives.reduce_scatter(etp_bytes, ctx.etp)
    comm_forward = 2 * a2a + etp_comm
    comm_backward = 2 * a2a + etp_comm + (comm_forward if redo_experts else 0.0)
    cost.comm_total_s += comm_forward + comm_backward
    if plan.ep_comm_overlap:
        # 1F1B all-to-all overlap / DualPipe: one micro-batch's all-to-all runs under another's compute,
        # which meanwhile runs without the SMs the communication kernels hold
        hide = forward + backward
        exposed_f = max(0.0, comm_forward - hide / 2)
        exposed_b = max(0.0, comm_backward - hide / 2)
        slow_f = device.overlap_slowdown_s(comm_forward - exposed_f)
        slow_b = device.overlap_slowdown_s(comm_backward - exposed_b)
        cost.forward_s += slow_f
        cost.backward_s += slow_b
    else:
        exposed_f, exposed_b = comm_forward, comm_backward
        slow_f = slow_b = 0.0
    cost.comm_forward_s += exposed_f
    cost.comm_backward_s += exposed_b
    if ctx.detail:
        executed = flops * (4 if redo_experts else 3)
        cost.ops.append(OpTime("experts.grouped_mm", "moe_gemm", forward, backward, redo, executed, operand_bytes))
        cost.ops.append(OpTime("moe.dispatch+combine", "ep_comm", exposed_f, exposed_b, 0.0))
        if slow_f or slow_b:
            cost.ops.append(OpTime("moe.overlap_sm_share", "overlap", slow_f, slow_b, 0.0))


def layer_cost(layer: LayerSpec, hidden: int, ctx: CostContext) -> LayerCost:
    """Price one layer (forward, backward, recompute, exposed comm, saved bytes) for one micro-batch."""
    plan, device = ctx.plan, ctx.device
    cost = LayerCost()
    full = plan.recompute_mode == "full"
    modules = plan.recompute_modules
    for lin in layer.linears:
        _linear(lin, ctx, cost, full or (lin.tag in modules and lin.tag != ""))
    for core in layer.attention:
        _attention(core, ctx, cost, full or "core_attn" in modules)
    imbalance = plan.moe_imbalance
    for p in layer.pointwise:
        tokens = ctx.sp_tokens if p.tp_sharded else float(ctx.tokens)
        nbytes = p.bytes_per_token * tokens * (imbalance if p.moe_rows else 1.0)
        forward = device.memory_time(nbytes, p.kernels)
        backward = device.memory_time(2 * nbytes, p.kernels)
        redo = forward if (full or (p.tag and p.tag in modules) or (p.tag == "moe_act" and "moe" in modules)) else 0.0
        cost.forward_s += forward
        cost.backward_s += backward
        cost.recompute_s += redo
        if ctx.detail:
            moved = nbytes * (3 + (1 if redo else 0))  # forward, backward (twice the forward), recompute
            cost.ops.append(OpTime(p.name, "pointwise", forward, backward, redo, bytes=moved))
    if layer.moe is not None:
        _moe(layer.moe, hidden, ctx, cost, modules, full)
    # tensor-parallel collectives (sequence parallel: AG/RS; without: an all-reduce per region)
    tp_forward = 0.0
    if plan.tp > 1:
        for c in layer.tp_collectives:
            nbytes = c.bytes_per_token * ctx.tokens
            if plan.sequence_parallel:
                tp_forward += (
                    collectives.all_gather(nbytes, ctx.tp)
                    if c.kind == "all_gather"
                    else collectives.reduce_scatter(nbytes, ctx.tp)
                )
            elif c.kind == "reduce_scatter":
                tp_forward += collectives.all_reduce(nbytes, ctx.tp)
    tp_backward = tp_forward + (tp_forward if full else 0.0)
    cost.comm_total_s += tp_forward + tp_backward
    if plan.tp_comm_overlap:
        # hidden under the tensor-parallel GEMMs they feed (forward), and under the backward's data and
        # weight gradients (the recompute's collectives under its re-run forward GEMMs)
        window_b = cost.tp_gemm_backward_s + (cost.tp_gemm_forward_s if full else 0.0)
        tp_forward_exposed = max(0.0, tp_forward - cost.tp_gemm_forward_s)
        tp_backward_exposed = max(0.0, tp_backward - window_b)
    else:
        tp_forward_exposed, tp_backward_exposed = tp_forward, tp_backward
    cost.comm_forward_s += tp_forward_exposed
    cost.comm_backward_s += tp_backward_exposed
    if ctx.detail and tp_forward:
        cost.ops.append(OpTime("tensor_parallel", "tp_comm", tp_forward_exposed, tp_backward_exposed, 0.0))
    # activations kept for the backward pass
    all_saved = 0.0
    kept = 0.0
    fp8 = plan.precision == "fp8"
    for s in layer.saved:
        tokens = ctx.sp_tokens if s.tp_sharded else float(ctx.tokens)
        nbytes = (
            s.bytes_per_token
            * tokens
            * (imbalance if s.moe_rows else 1.0)
            * (0.5 if fp8 and s.gemm_input else 1.0)
            * ctx.activation_scale
        )
        all_saved += nbytes
        dropped = s.tag and (s.tag in modules or (s.tag == "moe_act" and "moe" in modules))
        if not dropped:
            kept += nbytes
    if full:
        cost.transient_bytes = all_saved + cost.saved_bytes
        cost.saved_bytes = layer.input_bytes_per_token * ctx.sp_tokens * ctx.activation_scale
    else:
        cost.saved_bytes += kept
    _host(layer, ctx, cost)
    return cost


def layer_breakdown(spec: ModelSpec, plan: ParallelConfig, cluster: Cluster) -> dict[str, LayerCost]:
    """Every layer kind of `spec` priced op by op, for one micro-batch on one device: what the step
    estimate sums (`trex estimate --layers` prints it). The ops' forward (backward) times add up to
    the layer's forward (backward) compute plus the communication it leaves exposed."""
    ctx = CostContext.of(plan, cluster, detail=True)
    return {kind: layer_cost(layer, spec.hidden_size, ctx) for kind, layer in spec.layer_kinds.items()}


def _host(layer: LayerSpec, ctx: CostContext, cost: LayerCost) -> None:
    """Host time to issue the layer: its captured op counts (grouped GEMMs once per local expert) plus
    one op per tensor-parallel collective, at the profile's per-op cost. Recompute re-issues the
    share of the forward it re-runs (by device time; all of it under full recompute)."""
    plan, device = ctx.plan, ctx.device
    cost.syncs_host = layer.moe is not None and plan.moe_host_sync
    if layer.host_ops is None or device.host_op_us <= 0:
        return
    local_experts = layer.moe.num_experts / plan.ep if layer.moe is not None else 0.0
    collectives_issued = len(layer.tp_collectives) if plan.tp > 1 else 0
    forward = layer.host_ops.forward_ops(local_experts) + collectives_issued
    redone = forward * min(1.0, cost.recompute_s / cost.forward_s) if cost.forward_s > 0 else 0.0
    backward = layer.host_ops.backward_ops(local_experts) + collectives_issued + redone
    cost.host_forward_s = forward * device.host_op_us * 1e-6
    cost.host_backward_s = backward * device.host_op_us * 1e-6


def head_cost(spec: ModelSpec, ctx: CostContext, predictions: int) -> LayerCost:
    """Final norm, output GEMM (vocab-parallel) and fused cross-entropy, `predictions` times (MTP)."""
    plan, device = ctx.plan, ctx.device
    cost = LayerCost()
    vocab_shard = spec.vocab_size / plan.tp
    head = Linear("output_head", spec.hidden_size, spec.vocab_size, "column", fp8=False)
    for _ in range(predictions):
        _linear(head, ctx, cost, False)
        logits = ctx.tokens * vocab_shard
        forward = device.memory_time(
            logits * 2.0 * 3 + ctx.sp_tokens * spec.hidden_size * 4.0, 4
        )  # write, softmax pass, norm
        backward = device.memory_time(logits * 2.0 * 2, 2)
        cost.forward_s += forward
        cost.backward_s += backward
        cost.saved_bytes += (logits * 2.0 + ctx.sp_tokens * spec.hidden_size * 2.0) * ctx.activation_scale
        cost.transient_bytes = max(cost.transient_bytes, logits * 4.0)
        if plan.tp > 1:
            nbytes = ctx.tokens * spec.hidden_size * 2.0
            gather = collectives.all_gather(nbytes, ctx.tp) if plan.sequence_parallel else 0.0
            scatter = (
                collectives.reduce_scatter(nbytes, ctx.tp)
                if plan.sequence_parallel
                else collectives.all_reduce(nbytes, ctx.tp)
            )
            stats = collectives.all_reduce(ctx.tokens * 12.0, ctx.tp)
            cost.comm_forward_s += gather + stats
            cost.comm_backward_s += scatter
            cost.comm_total_s += gather + stats + scatter
        if ctx.detail:
            cost.ops.append(OpTime("cross_entropy", "pointwise", forward, backward))
    return cost


def embedding_cost(spec: ModelSpec, ctx: CostContext) -> LayerCost:
    """Embedding lookup (vocab-parallel, reduce-scattered into the sequence shards) and its gradient."""
    plan, device = ctx.plan, ctx.device
    cost = LayerCost()
    width = spec.hidden_size * spec.residual_streams
    nbytes = ctx.tokens * spec.hidden_size * 2.0
    cost.forward_s = device.memory_time(nbytes + ctx.sp_tokens * width * 2.0, 2)
    cost.backward_s = device.memory_time(2 * nbytes, 2)
    if plan.tp > 1:
        comm = (
            collectives.reduce_scatter(nbytes, ctx.tp)
            if plan.sequence_parallel
            else collectives.all_reduce(nbytes, ctx.tp)
        )
        cost.comm_forward_s = comm
        cost.comm_backward_s = comm
        cost.comm_total_s = 2 * comm
    if ctx.detail:
        cost.ops.append(OpTime("embedding", "pointwise", cost.forward_s, cost.backward_s))
    return cost
