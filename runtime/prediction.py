"""What the cost model predicts for a run: step time and memory per rank, on the calibrated `cpu` cluster
(or the named one), for the model's spec and the resolved plan.

Parameters, gradients, optimizer states and step time come from `cost_model.step.estimate_step`.
Activations come from the description of the program the rank executes (`runtime.activation_model`:
transformers' eager modules and the runtime's tp/ep implementations) where it covers the run; the
cost model's own activation formula prices production fused kernels (what the planner ranks plans
by) and is reported beside it as `activations_production_kernels`. Where the eager description does
not cover a run, the production formula is the prediction and `activation_model` says why.
On a CPU profile calibrated with eager issue costs, the step also pays what the rank issues (plain and DTensor
ops, FSDP2 unit passes), counted on rank 0's own program (`runtime.issued_ops`, `cost_model.eager_issue`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trex.cost_model.parallel import ParallelConfig


def predict(
    config: Any,
    plan: ParallelConfig,
    nproc: int,
    cluster: str = "cpu",
    *,
    compiled: bool = False,
    optimizer: str = "adamw",
) -> dict[str, Any]:
    """{"step_time_s", "memory_per_rank_bytes", "memory_bytes": {...}, "activation_model"} or {"error": why}
    when the model cannot price it. `compiled`: the ranks run `trex.compile`d models (--compile).
    `optimizer`: what the ranks step (`TrainJob.optimizer`); a plan that leaves it to the model ("auto",
    which for DeepSeek-V4 means Muon) is priced with the optimizer the run actually uses."""
    from trex.cost_model.catalog import get_cluster
    from trex.cost_model.model_spec import spec_from_config
    from trex.cost_model.step import estimate_step
    from trex.errors import TrexError
    from trex.runtime.activation_model import NotCovered, eager_activations
    from trex.runtime.issued_ops import count_issued, with_issue_counts

    try:
        spec = spec_from_config(config, getattr(config, "model_type", "model"))
        # transformers builds no multi-token-prediction layers (num_nextn_predict_layers is read only by
        # other frameworks): the runtime trains what is built, so the prediction leaves MTP out
        spec = dataclasses.replace(spec, mtp_layers=())
        if plan.optimizer == "auto":
            plan = dataclasses.replace(plan, optimizer=optimizer)
        if plan.data_parallel > 1 or plan.edp > 1:
            # runtime.data_parallel's ZeRO-1 all-reduces each gradient and keeps its shard (ZeRO-2 reduce-scatters)
            plan = dataclasses.replace(
                plan,
                grad_reduce_calls=reduction_calls(config, plan),
                grad_reduce_op="all_reduce" if plan.zero == 1 else "auto",
            )
        if plan.tp > 1:
            plan = dataclasses.replace(plan, **tp_gradient_sums(config, plan, compiled))
        machine = get_cluster(cluster, nproc)
        issue_note = issue_counts_note = None
        if _prices_issue(machine.device) and not compiled:
            counts = count_issued(config, plan, nproc, plan.optimizer)
            if isinstance(counts, str):
                issue_note = f"issue cost left out: {counts}"
            else:
                plan, issue_counts_note = with_issue_counts(plan, counts), counts.to_dict()
        estimate = estimate_step(spec, machine, plan)
    except TrexError as error:
        return {"error": str(error)}
    memory = estimate.memory
    try:
        eager = eager_activations(config, plan, compiled=compiled)
        activations, described = eager.total_bytes, eager.implementation
    except NotCovered as why:
        activations, described = memory.activations, f"production-kernel formula ({why})"
    parts = {
        "parameters": memory.weights,
        "gradients": memory.gradients,
        "optimizer_states": memory.optimizer_states,
        "activations": activations,
        "transient": memory.transient,
    }
    total = memory.total - memory.activations + activations
    return {
        "grad_reduce_calls": plan.grad_reduce_calls,
        "tp_grad_sync": plan.tp_grad_sync,
        "step_time_s": estimate.step_time_s,
        "step_breakdown_s": estimate.breakdown.to_dict(),
        "memory_per_rank_bytes": total,
        "memory_bytes": parts,
        "activations_production_kernels": memory.activations,
        "activation_model": described,
        "issued_ops": issue_counts_note,
        **({"issue_note": issue_note} if issue_note else {}),
    }


def _prices_issue(device: Any) -> bool:
    """Whether the device profile carries measured eager issue costs (a CPU calibrated by this `trex calibrate`):
    only then are a rank's ops counted (`runtime.issued_ops`, a few seconds in a process of its own)."""
    return any(getattr(device, key, 0.0) > 0 for key in ("eager_op_us", "dtensor_op_us", "fsdp_unit_us"))


def reduction_calls(config: Any, plan: ParallelConfig) -> tuple[int, int]:
    """(dense, expert) collectives one data-parallel gradient reduction (or weight gather) of the runtime issues.

    ZeRO-0/1/2 (`runtime.data_parallel.DataParallelAdamW`) reduce and gather tensor by tensor: one call per
    parameter tensor. ZeRO-3 (FSDP2, `runtime.parallelize`) issues one call per `fully_shard` unit: every decoder
    layer and the root module (embedding, final norm, head), plus each experts module under ep > 1 or tp > 1
    (sharded over the expert-data-parallel group on its own). Counted on the model built on the meta device (nothing allocated).
    """
    from trex.integrations.transformers_moe import experts_modules
    from trex.models import build_model

    model = build_model(config, device="meta")
    experts = experts_modules(model)
    expert_params = {id(p) for _, module in experts for p in (module.gate_up_proj, module.down_proj)}
    params = list(model.parameters())
    if plan.zero >= 3:
        layers = len(getattr(getattr(model, "model", model), "layers", []))
        # experts modules are FSDP units of their own under ep, and under tp at ep=1 (sharded over dp x tp)
        return layers + 1, len(experts) if plan.ep > 1 or plan.tp > 1 else 0
    dense = sum(1 for p in params if id(p) not in expert_params)
    return dense, len(expert_params)


# Parameters the runtime's tensor parallelism keeps whole on every tp rank (runtime.parallelize: not a DTensor, not a
# head/column shard): norms (1-D), routers, MLA's low-rank down-projections and V4's compressor/indexer weights.
_REPLICATED_UNDER_TP = (".mlp.gate.weight", "q_a_proj.weight", "kv_a_proj_with_mqa.weight", "compressor", "indexer")


def tp_gradient_sums(config: Any, plan: ParallelConfig, compiled: bool) -> dict[str, Any]:
    """How the runtime sums the tp-partial gradients (`ParamHome.partial_over`), as `ParallelConfig` fields: an
    eager rank's backward graph sums them once per step with the dp reduction (`ReducedGradient`), under ZeRO-2
    each micro-batch on the reduce-scattered shard; FSDP2 (zero=3) once per step on its shards after the backward
    (`FullyShardedAdamW.reduce_gradients`); a compiled rank's hook every micro-batch, whole."""
    calls, nbytes = tp_replicated_gradients(config, plan)
    dp = plan.data_parallel
    if plan.zero >= 3:
        return {"tp_grad_sync": (calls, nbytes / dp), "tp_grad_sync_per_step": True}
    if compiled:
        return {"tp_grad_sync": (calls, nbytes), "tp_grad_sync_per_step": False}
    if plan.zero == 2 and dp > 1:
        return {"tp_grad_sync": (calls, nbytes / dp), "tp_grad_sync_per_step": False}
    return {"tp_grad_sync": (calls, nbytes), "tp_grad_sync_per_step": True}


def tp_replicated_gradients(config: Any, plan: ParallelConfig) -> tuple[int, float]:
    """(all-reduces, bytes) of one tp sum of the gradients of parameters replicated on the tp ranks (one per
    tensor: `ParamHome.partial_over`; when and on how much of it, `tp_gradient_sums`). Counted on the meta-device
    model by the runtime's rule: 1-D parameters and the replicated projections."""
    from trex.integrations.transformers_moe import experts_modules
    from trex.models import build_model

    model = build_model(config, device="meta")
    experts = {id(p) for _, module in experts_modules(model) for p in module.parameters(recurse=False)}
    replicated = [
        p
        for name, p in model.named_parameters()
        if id(p) not in experts and (p.dim() == 1 or any(key in name for key in _REPLICATED_UNDER_TP))
    ]
    return len(replicated), float(sum(p.numel() * 4 for p in replicated))
