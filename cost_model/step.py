"""The step estimate of a plan: time, throughput, MFU and memory of one training step.

    estimate = estimate_step(get_model_spec("deepseek-v3"), get_cluster("h100", 1024), plan)

A step is: every device runs its pipeline chunks for m micro-batches in the (interleaved) 1F1B
order - compute, recompute and the communication the layer cannot hide (tensor parallelism,
expert all-to-alls, context-parallel rings), or longer where the host issuing the ops is the
slower side (`trex.cost_model.host`: host-bound stretches between synchronisations) - then waits for the data-parallel gradient
reduction the backward could not hide, steps the optimizer over its shard, and gathers updated
parameters (hidden behind the next step's first forward when `overlap_param_gather`).

    step = pipeline + exposed data-parallel sync + optimizer
    pipeline = m * max_d t_d + (pp - 1)/vpp * mean_d t_d (+ the p2p latency of the fill and drain)

The breakdown attributes the slowest device's time: compute (incl. recompute), exposed
communication, the time it waits for its host, the pipeline bubble and the optimizer.
FLOP conventions are in `trex.cost_model.flops`: `mfu` and `model_tflops_per_device` use
Megatron's per-GEMM count over the BF16 dense peak (also for FP8 runs), `mfu_6n` the 6N + attention count.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from trex.cost_model import collectives, eager_issue
from trex.cost_model.caveats import estimate_caveats
from trex.cost_model.cluster import Cluster
from trex.cost_model.devices import GIB
from trex.cost_model.flops import megatron_flops_per_token, six_n_flops_per_token
from trex.cost_model.host import chunk_host_wait
from trex.cost_model.layer_cost import CostContext, LayerCost, embedding_cost, head_cost, layer_cost
from trex.cost_model.memory import (
    MemoryEstimate,
    ParamCounts,
    activation_memory,
    optimizer_step_time,
    parameter_bytes,
    static_memory,
)
from trex.cost_model.model_spec import LayerSpec, ModelSpec
from trex.cost_model.parallel import InfeasiblePlan, ParallelConfig, RankLayout, validate
from trex.cost_model.pipeline import closed_form_makespan, default_layers_per_chunk, device_chunks, in_flight


@dataclass(frozen=True)
class Breakdown:
    compute_s: float  # forward + backward + recompute on the slowest device
    recompute_s: float  # the recompute part of compute_s
    exposed_comm_s: float  # TP/EP/CP/p2p inside the pipeline + DP sync the backward did not hide
    bubble_s: float
    optimizer_s: float
    dp_sync_s: float  # the data-parallel part of exposed_comm_s
    host_wait_s: float = 0.0  # the device idle while the host issues ops (host-bound stretches, trex.cost_model.host)
    eager_issue_s: float = 0.0  # an eager CPU rank issuing its counted ops (trex.cost_model.eager_issue)

    def to_dict(self) -> dict[str, float]:
        return {
            "compute": self.compute_s,
            "recompute": self.recompute_s,
            "exposed_communication": self.exposed_comm_s,
            "bubble": self.bubble_s,
            "optimizer": self.optimizer_s,
            "data_parallel_sync": self.dp_sync_s,
            "host_wait": self.host_wait_s,
            "eager_issue": self.eager_issue_s,
        }


@dataclass(frozen=True)
class ChunkTimes:
    """One pipeline chunk, one micro-batch: what the trace draws."""

    index: int
    layers: tuple[int, ...]
    forward_s: float  # compute + exposed communication of the forward
    backward_s: float  # compute + recompute + exposed communication of the backward
    comm_forward_s: float
    comm_backward_s: float
    recompute_s: float
    saved_bytes: float
    host_wait_s: float = (
        0.0  # forward + backward time the device waits for the host (included in forward_s, backward_s)
    )


@dataclass(frozen=True)
class StepEstimate:
    model: str
    cluster: str
    device: str
    devices: int
    plan: ParallelConfig
    step_time_s: float
    tokens_per_step: int
    flops_per_token: float  # Megatron per-GEMM convention
    flops_per_token_6n: float
    executed_flops_per_step: float
    peak_flops: float  # BF16 dense peak per device (the MFU denominator)
    breakdown: Breakdown
    memory: MemoryEstimate
    chunks: tuple[ChunkTimes, ...]
    p2p_s: float
    per_device_s: tuple[float, ...]
    violations: tuple[str, ...] = ()
    memory_by_device: tuple[float, ...] = ()  # bytes each pipeline device holds at its peak
    seconds_to_estimate: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def feasible(self) -> bool:
        return not self.violations and self.memory.fits

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def tokens_per_s_per_device(self) -> float:
        return self.tokens_per_s / self.devices

    @property
    def model_tflops_per_device(self) -> float:
        return self.flops_per_token * self.tokens_per_s_per_device / 1e12

    @property
    def mfu(self) -> float:
        return self.flops_per_token * self.tokens_per_s_per_device / self.peak_flops

    @property
    def mfu_6n(self) -> float:
        return self.flops_per_token_6n * self.tokens_per_s_per_device / self.peak_flops

    @property
    def hfu(self) -> float:
        """Hardware FLOP utilisation: executed FLOPs (recompute, duplicated GEMMs) over peak."""
        return self.executed_flops_per_step / self.step_time_s / self.devices / self.peak_flops

    def to_dict(self) -> dict[str, Any]:
        memory = self.memory.gib()
        return {
            "model": self.model,
            "cluster": self.cluster,
            "device": self.device,
            "devices": self.devices,
            "plan": self.plan.to_dict(),
            "feasible": self.feasible,
            "violations": list(self.violations) + self.memory_violations(),
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_device": self.tokens_per_s_per_device,
            "model_tflops_per_device": self.model_tflops_per_device,
            "mfu": self.mfu,
            "mfu_6n": self.mfu_6n,
            "hfu": self.hfu,
            "flops_per_token": self.flops_per_token,
            "flops_per_token_6n": self.flops_per_token_6n,
            "flop_convention": "megatron per-GEMM (mfu, model_tflops_per_device); 6N_active + 12LHQT (mfu_6n); peak = dense BF16",
            "memory_per_device_gib": memory["total"],
            "memory_gib": memory,
            "breakdown": self.breakdown.to_dict(),
            "microbatches": self.plan.microbatches,
            "seconds_to_estimate": self.seconds_to_estimate,
            "notes": list(self.notes),
            "pipeline": self.stages(),
        }

    def stages(self) -> list[dict[str, Any]]:
        """Per pipeline device: its chunks (decoder layers each), time per micro-batch and peak memory."""
        pp, vpp = self.plan.pp, self.plan.vpp
        out = []
        for d in range(pp):
            ids = [d + j * pp for j in range(vpp)]
            out.append(
                {
                    "device": d,
                    "chunks": ids,
                    "layers_per_chunk": [len(self.chunks[c].layers) for c in ids],
                    "holds_embedding": 0 in ids,
                    "holds_head": len(self.chunks) - 1 in ids,
                    "time_per_microbatch_s": self.per_device_s[d],
                    "host_wait_per_microbatch_s": sum(self.chunks[c].host_wait_s for c in ids),
                    "memory_gib": self.memory_by_device[d] / GIB if self.memory_by_device else None,
                }
            )
        return out

    def memory_violations(self) -> list[str]:
        if self.memory.fits:
            return []
        m = self.memory.gib()
        return [
            f"memory {m['total']:.1f} GiB per device exceeds the {m['capacity']:.1f} GiB usable on {self.device} "
            f"(weights {m['weights']:.1f}, gradients {m['gradients']:.1f}, optimizer {m['optimizer_states']:.1f}, "
            f"activations {m['activations']:.1f}, transient {m['transient']:.1f})"
        ]


def _layer_params(layer: LayerSpec, hidden: int, plan: ParallelConfig) -> ParamCounts:
    dense = 0.0
    fp8 = 0.0
    for lin in layer.linears:
        share = lin.params / plan.tp if lin.parallel in ("column", "row") else lin.params
        dense += share
        fp8 += share if lin.fp8 else 0.0
    dense += layer.norm_params + layer.extra_params + layer.head_params / plan.tp
    expert = layer.expert_params(hidden) / (plan.ep * plan.etp)
    matrices = dense - layer.norm_params - layer.extra_params - layer.head_params / plan.tp
    return ParamCounts(dense=dense, expert=expert, muon=matrices + expert, fp8_gemm=fp8 + expert)


def _muon_flops(layer: LayerSpec, hidden: int, plan: ParallelConfig) -> float:
    """Newton-Schulz (5 iterations) flops for this device's share of the layer's matrices."""
    total = 0.0
    for count, rows, cols in layer.muon_matrices:
        r, c = sorted((rows, cols / plan.tp))
        total += count * 5 * (4 * r * r * c + 2 * r**3)
    if layer.moe:
        r, c = sorted((layer.moe.expert_ffn / plan.etp, float(hidden)))
        experts = layer.moe.num_experts / plan.ep
        total += experts * 3 * 5 * (4 * r * r * c + 2 * r**3)
    return total / plan.data_parallel  # each DP rank orthogonalises its share of the matrices


def data_parallel_exposure(
    plan: ParallelConfig, grad_sync: float, gather: float, forward: float, backward: float
) -> tuple[float, float]:
    """(exposed, total) seconds of one device's data-parallel traffic in a step.

    `grad_sync` is one reduction of the device's gradients, `gather` one all-gather of its parameters,
    `forward` / `backward` one micro-batch's passes over its chunks (the windows they can hide under).
    ZeRO-0/1 accumulate the micro-batches and reduce once, under the last backward; the updated
    parameters are gathered once, under the next step's first forward. Sharded gradients (ZeRO-2/3)
    leave no buffer to accumulate in: every micro-batch's backward reduce-scatters its own (DeepSpeed
    ZeRO-2, FSDP). ZeRO-3 keeps no resident copy: every micro-batch gathers the parameters for its
    forward and again for its backward, each prefetched under the layer before it; the forward's
    gathers hide under the forwards, the backward's share the backwards with the reduce-scatters
    (the same links).
    """
    m = plan.microbatches
    if plan.zero < 2:
        window_b = backward if plan.overlap_grad_reduce else 0.0
        window_f = forward if plan.overlap_param_gather else 0.0
        return max(0.0, grad_sync - window_b) + max(0.0, gather - window_f), grad_sync + gather
    reduce = m * grad_sync
    window_b = m * backward if plan.overlap_grad_reduce else 0.0
    if plan.zero == 2:
        window_f = forward if plan.overlap_param_gather else 0.0
        return max(0.0, reduce - window_b) + max(0.0, gather - window_f), reduce + gather
    each = m * gather  # the forwards' gathers, and as many for the backwards
    if not plan.overlap_param_gather:
        return 2 * each + max(0.0, reduce - window_b), reduce + 2 * each
    return max(0.0, each - m * forward) + max(0.0, each + reduce - window_b), reduce + 2 * each


def _reduction_calls(plan: ParallelConfig, layer_fraction: float) -> tuple[int, int]:
    """How many collectives one data-parallel reduction (or gather) of a device's (dense, expert) parameters is
    issued as: one per bucket when the framework flattens gradients into a bucket (`plan.grad_reduce_calls` None,
    the production default), else the given counts for the whole model (one per parameter tensor for a per-tensor
    ZeRO, one per FSDP unit), shared out over pipeline stages by their fraction of the layers."""
    if plan.grad_reduce_calls is None:
        return 1, 1
    dense_calls, expert_calls = plan.grad_reduce_calls
    return max(1, round(dense_calls * layer_fraction)), max(1, round(expert_calls * layer_fraction))


def estimate_step(
    spec: ModelSpec, cluster: Cluster, plan: ParallelConfig, *, check: bool = True, detail: bool = False
) -> StepEstimate:
    """Price one training step of `plan` for `spec` on `cluster` (sized to its device count).

    With `check=True` an inconsistent plan raises `InfeasiblePlan` naming each violated
    constraint; memory over capacity is reported on the estimate (`feasible`, `violations`).
    """
    started = time.perf_counter()
    plan = plan.with_devices(cluster.devices)
    problems = validate(plan, spec, cluster.devices)
    if problems:
        raise InfeasiblePlan(problems)
    device = cluster.device
    if not device.supports(plan.precision):
        raise InfeasiblePlan(
            [
                f"precision {plan.precision} is not supported by {device.name} (it has {', '.join(sorted(device.peak_tflops))})"
            ]
        )
    ctx = CostContext.of(plan, cluster, detail=detail)
    hidden = spec.hidden_size
    kind_costs: dict[str, LayerCost] = {
        kind: layer_cost(layer, hidden, ctx) for kind, layer in spec.layer_kinds.items()
    }
    chunks_n = plan.pp * plan.vpp
    split = plan.layers_per_chunk or default_layers_per_chunk(spec.num_layers, chunks_n)
    bounds = [0]
    for count in split:
        bounds.append(bounds[-1] + count)
    embed = embedding_cost(spec, ctx)
    head = head_cost(spec, ctx, 1 + len(spec.mtp_layers))
    layout = RankLayout.of(plan)
    stage_ranks = plan.stage_ranks
    p2p_tier = cluster.tier_between(0, stage_ranks) if plan.pp > 1 else None
    p2p_bytes = ctx.sp_tokens * hidden * spec.residual_streams * 2.0
    p2p = collectives.send_recv(p2p_bytes, p2p_tier) if p2p_tier else 0.0

    # Chunks are priced by signature (how many layers of each kind, embedding, head): a 94-layer
    # model split into 32 chunks has only a handful of distinct chunks.
    kind_params = {kind: _layer_params(layer, hidden, plan) for kind, layer in spec.layer_kinds.items()}
    kind_muon = {kind: _muon_flops(layer, hidden, plan) for kind, layer in spec.layer_kinds.items()}
    exposed_p2p = 0.0 if (plan.overlap_p2p or plan.pp == 1) else p2p
    share = cluster.time_share
    signature_cache: dict[tuple, tuple[ChunkTimes, ParamCounts, float, float, float, float, float, float]] = {}
    chunks: list[ChunkTimes] = []
    chunk_params: list[ParamCounts] = []
    chunk_muon_flops: list[float] = []
    recompute_per_chunk: list[float] = []
    compute_per_chunk: list[float] = []
    comm_per_chunk: list[float] = []
    executed_flops = 0.0
    transient = 0.0
    for c in range(chunks_n):
        layer_ids = tuple(range(bounds[c], bounds[c + 1]))
        counts: dict[str, int] = {}
        for i in layer_ids:
            kind = spec.layers[i].kind
            counts[kind] = counts.get(kind, 0) + 1
        first, last = c == 0, c == chunks_n - 1
        key = (tuple(sorted(counts.items())), first, last)
        if key not in signature_cache:
            parts: list[tuple[LayerCost, int]] = [(kind_costs[k], n) for k, n in counts.items()]
            params = ParamCounts()
            muon_flops = 0.0
            for k, n in counts.items():
                params = params + kind_params[k].scaled(n)
                muon_flops += kind_muon[k] * n
            if first:
                parts.append((embed, 1))
                params = params + ParamCounts(dense=spec.embedding_params / plan.tp)
            if last:
                for layer in spec.mtp_layers:
                    parts.append((kind_costs[layer.kind], 1))
                    params = params + kind_params[layer.kind]
                    muon_flops += kind_muon[layer.kind]
                parts.append((head, 1))
                head_weights = spec.head_params or (spec.vocab_size * hidden if plan.pp > 1 else 0)
                params = params + ParamCounts(dense=head_weights / plan.tp + spec.final_norm_params)
            # ranks that time-share a CPU's cores (cluster.time_share > 1) run their kernels that much slower;
            # measured collectives already include it
            f = share * sum(p.forward_s * n for p, n in parts)
            b = share * sum(p.backward_s * n for p, n in parts)
            r = share * sum(p.recompute_s * n for p, n in parts)
            cf = sum(p.comm_forward_s * n for p, n in parts)
            cb = sum(p.comm_backward_s * n for p, n in parts)
            saved = sum(p.saved_bytes * n for p, n in parts)
            flops = sum(p.flops * n for p, n in parts)
            peak = max((p.transient_bytes for p, _ in parts), default=0.0)
            wait_f, wait_b = (share * w for w in chunk_host_wait(parts))
            times = ChunkTimes(
                c,
                layer_ids,
                f + cf + wait_f + exposed_p2p,
                b + r + cb + wait_b + exposed_p2p,
                cf + exposed_p2p,
                cb + exposed_p2p,
                r,
                saved,
                wait_f + wait_b,
            )
            signature_cache[key] = (times, params, muon_flops, r, f + b + r, cf + cb + 2 * exposed_p2p, flops, peak)
        times, params, muon_flops, r, compute, comm, flops, peak = signature_cache[key]
        chunks.append(
            ChunkTimes(
                c,
                layer_ids,
                times.forward_s,
                times.backward_s,
                times.comm_forward_s,
                times.comm_backward_s,
                r,
                times.saved_bytes,
                times.host_wait_s,
            )
        )
        chunk_params.append(params)
        chunk_muon_flops.append(muon_flops)
        recompute_per_chunk.append(r)
        compute_per_chunk.append(compute)
        comm_per_chunk.append(comm)
        executed_flops += flops * plan.microbatches * stage_ranks  # all ranks of the stage
        transient = max(transient, peak)

    m = plan.microbatches
    per_device = []
    for d in range(plan.pp):
        ids = device_chunks(d, plan.pp, plan.vpp)
        per_device.append(sum(chunks[c].forward_s + chunks[c].backward_s for c in ids))
    pipeline = closed_form_makespan(per_device, m, plan.vpp)
    if plan.pp > 1 and plan.overlap_p2p:
        pipeline += 2 * (plan.pp - 1) * p2p  # fill and drain cross every stage boundary once each way
    slowest = max(range(plan.pp), key=lambda d: per_device[d])
    slow_ids = device_chunks(slowest, plan.pp, plan.vpp)

    # data-parallel gradient sync and parameter gather, per device (the slowest stage's share)
    muon = (plan.optimizer if plan.optimizer != "auto" else spec.optimizer) == "muon"
    dp_sync = 0.0
    dp_sync_total = 0.0
    optimizer = 0.0
    memory_worst: MemoryEstimate | None = None
    memory_by_device: list[float] = []
    dp_place = (
        cluster.strided_placement(*layout.groups["dp"])
        if plan.cp == 1
        else cluster.strided_placement(plan.cp * plan.data_parallel, plan.tp)
    )
    edp_place = cluster.strided_placement(*layout.groups["edp"])
    grad_bytes = 4.0 if plan.grad_dtype == "fp32" else 2.0
    weight_bytes = parameter_bytes(plan.precision, plan.param_dtype)  # what the gather moves: the updated weights
    device_cache: dict[tuple, tuple[float, float, float, MemoryEstimate]] = {}
    for d in range(plan.pp):
        ids = device_chunks(d, plan.pp, plan.vpp)
        flights = in_flight(d, plan.pp, plan.vpp, m)
        holds_head = d == (chunks_n - 1) % plan.pp
        key = (
            tuple(
                chunks[c].layers and (len(chunks[c].layers), spec.layers[chunks[c].layers[0]].kind) or (0, "")
                for c in ids
            ),
            tuple(c in (0, chunks_n - 1) for c in ids),
            tuple(flights),
            tuple(chunks[c].saved_bytes for c in ids),
            tuple(chunks[c].forward_s for c in ids),
            tuple(chunks[c].backward_s for c in ids),
            holds_head,
        )
        if key not in device_cache:
            params = ParamCounts()
            for c in ids:
                params = params + chunk_params[c]
            dense_grads = params.dense * grad_bytes
            expert_grads = params.expert * grad_bytes
            layer_fraction = sum(len(chunks[c].layers) for c in ids) / max(1, spec.num_layers)
            dense_calls, expert_calls = _reduction_calls(plan, layer_fraction)

            def issued(kind: str, nbytes: float, place, calls: int) -> float:
                """`calls` collectives of `kind` that together move `nbytes` (a bucket or tensor each)."""
                return calls * collectives.collective_time(kind, nbytes / calls, place) if nbytes > 0 else 0.0

            reduce_op = plan.grad_reduce_op if plan.grad_reduce_op != "auto" else None
            reduce_op = reduce_op or ("reduce_scatter" if plan.zero >= 1 else "all_reduce")
            grad_sync = issued(reduce_op, dense_grads, dp_place, dense_calls) + issued(
                reduce_op, expert_grads, edp_place, expert_calls
            )
            gather = 0.0
            if plan.zero >= 1:
                gather = issued("all_gather", params.dense * weight_bytes, dp_place, dense_calls) + issued(
                    "all_gather", params.expert * weight_bytes, edp_place, expert_calls
                )
            forward = sum(chunks[c].forward_s for c in ids)
            backward = sum(chunks[c].backward_s for c in ids)
            exposed, sync_total = data_parallel_exposure(plan, grad_sync, gather, forward, backward)
            step_opt = share * optimizer_step_time(
                params,
                device,
                dp=plan.data_parallel * plan.cp,
                edp=plan.edp,
                zero=plan.zero,
                grad_dtype=plan.grad_dtype,
                state_dtype=plan.optimizer_state_dtype,
                muon=muon,
                muon_flops=sum(chunk_muon_flops[c] for c in ids),
            )
            weights, grads, states = static_memory(
                params,
                dp=plan.data_parallel * plan.cp,
                edp=plan.edp,
                zero=plan.zero,
                precision=plan.precision,
                grad_dtype=plan.grad_dtype,
                state_dtype=plan.optimizer_state_dtype,
                muon=muon,
                param_dtype=plan.param_dtype,
            )
            acts = activation_memory([chunks[c].saved_bytes for c in ids], flights)
            extra = max(transient, head.transient_bytes if holds_head else 0.0)
            device_cache[key] = (
                exposed,
                step_opt,
                sync_total,
                MemoryEstimate(weights, grads, states, acts, extra, device.usable_memory_bytes),
            )
        exposed, step_opt, sync_total, estimate = device_cache[key]
        if d == slowest or exposed + step_opt > dp_sync + optimizer:
            dp_sync, optimizer = max(dp_sync, exposed), max(optimizer, step_opt)
        dp_sync_total = max(dp_sync_total, sync_total)
        memory_by_device.append(estimate.total)
        if memory_worst is None or estimate.total > memory_worst.total:
            memory_worst = estimate
    assert memory_worst is not None
    # an executor that sums the tp-replicated parameters' gradients every backward, tensor by tensor, blocking
    tp_sync = 0.0
    if plan.tp > 1 and plan.tp_grad_sync is not None:
        calls, nbytes = plan.tp_grad_sync
        if calls > 0:
            tp_place = cluster.strided_placement(*layout.groups["tp"])
            times = 1 if plan.tp_grad_sync_per_step else m
            tp_sync = times * calls * collectives.all_reduce(max(nbytes, 1.0) / calls, tp_place)
    dp_sync += tp_sync
    # an eager CPU rank issues every op on the core that runs its kernels: the counted ops' issue cost adds up
    issue = (
        share * eager_issue.issue_seconds(eager_issue.IssueCounts(*plan.issued_ops), device) if plan.issued_ops else 0.0
    )
    step = pipeline + dp_sync + optimizer + issue

    compute = m * sum(compute_per_chunk[c] for c in slow_ids)
    recompute = m * sum(recompute_per_chunk[c] for c in slow_ids)
    comm = m * sum(comm_per_chunk[c] for c in slow_ids)
    host_wait = m * sum(chunks[c].host_wait_s for c in slow_ids)
    bubble = max(0.0, pipeline - compute - comm - host_wait)
    breakdown = Breakdown(compute, recompute, comm + dp_sync, bubble, optimizer, dp_sync, host_wait, issue)
    tokens = plan.gbs * plan.seq
    notes = list(spec.assumptions)
    if device.name == "cpu" and not device.calibrated:
        notes.append(
            "the cpu profile is not calibrated (its numbers are rough defaults, not measurements): run `trex calibrate`"
        )
    notes += estimate_caveats(spec, plan)
    return StepEstimate(
        model=spec.name,
        cluster=cluster.name,
        device=device.name,
        devices=cluster.devices,
        plan=plan,
        step_time_s=step,
        tokens_per_step=tokens,
        flops_per_token=megatron_flops_per_token(spec, plan.seq),
        flops_per_token_6n=six_n_flops_per_token(spec, plan.seq),
        executed_flops_per_step=executed_flops,
        peak_flops=device.peak_flops("bf16"),
        breakdown=breakdown,
        memory=memory_worst,
        chunks=tuple(chunks),
        p2p_s=p2p,
        per_device_s=tuple(per_device),
        violations=(),
        seconds_to_estimate=time.perf_counter() - started,
        notes=tuple(notes),
        memory_by_device=tuple(memory_by_device),
    )


def gib(nbytes: float) -> float:
    return nbytes / GIB


def infeasible_dict(problems: list[str], **context: Any) -> dict[str, Any]:
    """The `--json` shape of a plan that cannot run: data, not a traceback."""
    return {**context, "feasible": False, "violations": problems, "step_time_s": math.nan}
