"""The dtypes of what a rank holds for training: one layout the runtime runs and the cost model prices.

`trex train` builds the model in float32 and keeps it there under every `--precision`. With `--precision bf16`
the forward and backward compute in bf16 under `torch.autocast`, which casts each op's inputs (weights
included) per op; the parameters, their gradients and AdamW's (or Muon's) states stay float32, and there is
no separate master copy: the optimizer steps the parameters themselves. That is not the production
mixed-precision layout the planner prices by default (bf16 weights, an fp32 main-gradient buffer, an fp32
master copy with the optimizer states: `ParallelConfig.param_dtype = None`), so the plan a run resolves says
which layout it is (`param_dtype="fp32"`), the prediction prices exactly that, and the trainer refuses to run
a plan that names another layout or a model whose parameters are not stored as the plan says.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from trex.cost_model.parallel import ParallelConfig
from trex.errors import TrexError

PARAM_DTYPE = "fp32"  # parameters as stored and stepped (autocast computes in the plan's precision from them)
GRAD_DTYPE = "fp32"  # gradients: the parameters' dtype (autograd accumulates into .grad)
STATE_DTYPE = "fp32"  # optimizer moments / momentum: created like the parameters (torch.optim)

_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def runtime_layout(plan: ParallelConfig) -> ParallelConfig:
    """`plan` with the dtype layout this runtime executes."""
    return dataclasses.replace(plan, param_dtype=PARAM_DTYPE, grad_dtype=GRAD_DTYPE, optimizer_state_dtype=STATE_DTYPE)


def check_layout(model: nn.Module, plan: ParallelConfig) -> None:
    """Refuse a plan whose dtype layout is not the runtime's, or a model not stored in it (before any step)."""
    layout = (plan.param_dtype, plan.grad_dtype, plan.optimizer_state_dtype)
    if layout != (PARAM_DTYPE, GRAD_DTYPE, STATE_DTYPE):
        raise TrexError(
            f"the plan's dtype layout (parameters {plan.param_dtype or plan.precision + ' with an fp32 master copy'}, "
            f"gradients {plan.grad_dtype}, optimizer states {plan.optimizer_state_dtype}) is not the one the runtime "
            f"trains in (parameters, gradients and optimizer states {PARAM_DTYPE}, compute in --precision under "
            "autocast); resolve the plan with trex.runtime.run_plan.resolve_plan (trex train does)"
        )
    want = _TORCH_DTYPES[PARAM_DTYPE]
    wrong = [(name, p.dtype) for name, p in model.named_parameters() if p.dtype != want]
    if wrong:
        raise TrexError(
            f"{len(wrong)} parameter(s) are not stored in {PARAM_DTYPE} (first: {wrong[0][0]} is {wrong[0][1]}); "
            f"the runtime keeps parameters in {PARAM_DTYPE} and computes in --precision under autocast"
        )
