"""Route transformers' MoE experts modules through the fused `trex.moe_experts` op.

transformers 5.x picks an experts implementation by name from `ALL_EXPERTS_FUNCTIONS` (read from
`config._experts_implementation`). trex registers one more, "trex", that calls one op per layer.
Its eager result is the same function the default `grouped_mm` implementation computes, so switching
a model to it changes how it is captured, not what it computes.

An experts module whose layout the fused op does not cover (biases, interleaved gate/up, no gate,
post-expert norm, an unknown gate function, expert parallelism inside transformers) keeps
transformers' own grouped_mm implementation; `experts_coverage` reports which modules those are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trex.ops import moe as moe_ops

IMPLEMENTATION_NAME = "trex"


@dataclass(frozen=True)
class ExpertsLayout:
    """What the fused op needs to know about one experts module, or why it cannot take it."""

    activation: str | None
    swiglu_limit: float
    weights_transposed: bool
    unsupported_reason: str | None = None


def _activation_name(act_fn: nn.Module) -> str | None:
    from transformers.activations import GELUActivation, NewGELUActivation, PytorchGELUTanh, SiLUActivation

    if isinstance(act_fn, (nn.SiLU, SiLUActivation)):
        return "silu"
    if isinstance(act_fn, (PytorchGELUTanh, NewGELUActivation)):
        return "gelu_tanh"
    if isinstance(act_fn, (nn.GELU, GELUActivation)):
        approximate = getattr(act_fn, "approximate", "none")
        return "gelu_tanh" if approximate == "tanh" else "gelu"
    if isinstance(act_fn, nn.ReLU):
        return "relu"
    return None


def _gate_limit(module: nn.Module) -> float | None:
    """0.0 for the default gate (act(gate) * up); the SwiGLU limit for DeepSeek-V4's clamped gate."""
    from transformers.integrations.moe import _default_apply_gate

    gate = type(module)._apply_gate
    if gate is _default_apply_gate:
        return 0.0
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts

    if gate is DeepseekV4Experts._apply_gate:
        return float(module.limit)
    return None


def experts_layout(module: nn.Module) -> ExpertsLayout:
    def unsupported(reason: str) -> ExpertsLayout:
        return ExpertsLayout(None, 0.0, False, reason)

    if getattr(module, "has_bias", False):
        return unsupported("experts have biases")
    if not getattr(module, "has_gate", True):
        return unsupported("experts have no gate (up projection only)")
    if not getattr(module, "is_concatenated", True):
        return unsupported("gate and up weights are interleaved, not concatenated")
    if getattr(module, "has_post_expert_norm", False):
        return unsupported("experts apply a post-expert norm")
    if getattr(module, "_is_expert_parallel", False):
        return unsupported("transformers' own expert parallelism is active")
    activation = _activation_name(getattr(module, "act_fn", None))
    if activation is None:
        return unsupported(
            f"activation {type(getattr(module, 'act_fn', None)).__name__} is not one of {sorted(moe_ops.ACTIVATIONS)}"
        )
    limit = _gate_limit(module)
    if limit is None:
        return unsupported(f"{type(module).__name__}._apply_gate is a gate trex does not know")
    return ExpertsLayout(activation, limit, bool(getattr(module, "is_transposed", False)))


def trex_experts_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The "trex" experts implementation: one `trex.moe_experts` op (or transformers' grouped_mm)."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    layout = experts_layout(self)
    if layout.unsupported_reason is not None:
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    out, *_saved_for_backward = torch.ops.trex.moe_experts(
        hidden_states,
        top_k_index,
        top_k_weights,
        self.gate_up_proj,
        self.down_proj,
        layout.activation,
        layout.swiglu_limit,
        layout.weights_transposed,
    )
    return out


def register() -> None:
    """Make "trex" a valid `experts_implementation` (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if IMPLEMENTATION_NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION_NAME, trex_experts_forward)


def experts_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every transformers experts module in `model` (modules with 3-D gate_up_proj and down_proj)."""
    found = []
    for name, module in model.named_modules():
        weights = (getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None))
        if all(isinstance(w, torch.Tensor) and w.dim() == 3 for w in weights) and hasattr(module, "config"):
            found.append((name, module))
    return found


def experts_coverage(model: nn.Module) -> dict[str, str | None]:
    """For each experts module: None when the fused op takes it, else the reason it does not."""
    return {name: experts_layout(module).unsupported_reason for name, module in experts_modules(model)}


def use_trex_experts(model: nn.Module) -> str | None:
    """Switch a transformers model to the "trex" experts implementation; returns the previous one.

    Returns None (and changes nothing) when the model has no experts modules.
    """
    if not experts_modules(model):
        return None
    register()
    previous = getattr(model.config, "_experts_implementation", None)
    if previous != IMPLEMENTATION_NAME:
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation(IMPLEMENTATION_NAME)
        else:
            for _, module in experts_modules(model):
                module.config._experts_implementation = IMPLEMENTATION_NAME
    return previous
