"""`trex.compile(model, plan=...)` with degrees above 1: apply the plan inside the caller's process group.

`trex train` starts and owns its ranks. A user who writes their own loop starts the ranks themselves
(`torchrun --nproc-per-node N train.py`, which initialises torch.distributed) and calls
`trex.compile(model, plan=...)` on every rank: the plan is checked against the model, the world size
and what the runtime executes, then applied to the model in place (`runtime.parallelize`: tp/ep
sharding, FSDP2 for ZeRO-3) before capture, so the rank's captured graph is the sharded one. The
result (`AppliedPlan`) is kept as `compiled.trex.applied`; the training loop uses its pieces:

  optimizer          `reduce_gradients()` after the last micro-batch's backward, then `step()`
                     (AdamW over the plan's replica groups, ZeRO-1/2 sharded; lr/weight decay in
                     `optimizer.optimizer.param_groups`)
  replica_index/replicas   which rows of the global batch this rank feeds (ranks of one tp group feed the same)
  loss_context()     around the loss and its backward (vocabulary-parallel cross-entropy under tp)

The loss each rank back-propagates must be normalised by the tokens of the *global* batch (the
gradients are summed over replicas), as `runtime.trainer` does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trex.errors import TrexError

DEFAULT_LR = 1e-3
DEFAULT_WEIGHT_DECAY = 0.01


def apply_in_process_group(model: nn.Module, plan: Any) -> Any:
    """Apply `plan` (a `trex.plan.Plan` with world size > 1) to `model` on this rank; returns the `AppliedPlan`."""
    from trex.runtime.parallelize import parallelize
    from trex.runtime.run_plan import PlanRefused, runtime_limits

    p = plan.parallel
    launch = f"torchrun --nproc-per-node {plan.world_size} your_script.py"
    if not dist.is_available() or not dist.is_initialized():
        raise TrexError(
            f"this plan needs {plan.world_size} processes (tp*pp*cp*dp = {p.tp}*{p.pp}*{p.cp}*{p.data_parallel}) "
            "and torch.distributed is not initialised in this one; start the processes with "
            f"`{launch}` (which initialises it; or call torch.distributed.init_process_group on every rank) "
            f"and call trex.compile(model, plan=...) on each, or run multi-process plans with `trex train --plan "
            f'"{p.label()}" --nproc {plan.world_size}` (trex.runtime)'
        )
    world = dist.get_world_size()
    if world != plan.world_size:
        raise TrexError(
            f"this plan needs {plan.world_size} processes (tp*pp*cp*dp = {p.tp}*{p.pp}*{p.cp}*{p.data_parallel}); "
            f"the initialised process group has {world}; start {plan.world_size} ranks (`{launch}`) or plan for {world}"
        )
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", "") or ""
    problems = runtime_limits(
        p,
        model_type,
        vocab_size=getattr(config, "vocab_size", 0) or 0,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
    )
    if p.tp > 1:
        from trex.runtime.tensor_parallel_heads import FAMILIES, check_divisible

        if model_type in FAMILIES:
            problems += check_divisible(config, p.tp)
    if problems:
        raise PlanRefused(problems)
    devices = {param.device for param in model.parameters()}
    device = next(iter(devices)) if len(devices) == 1 else torch.device("cpu")
    applied = parallelize(model, p, device, lr=DEFAULT_LR, weight_decay=DEFAULT_WEIGHT_DECAY)
    applied.notes.append(f"applied by trex.compile on rank {dist.get_rank()} of {world}")
    return applied
