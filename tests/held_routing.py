"""Routing held to a recorded choice, so a numerics test judges a compiled MoE step's continuous numerics.

Why: an MoE model's loss is a discontinuous function of rounding noise. Where a token's best experts (or V3's
expert groups) are closer than the noise of the router's input, any change of summation order - a fused
Inductor loop instead of ATen's kernel, one ulp in an fp32 `rsqrt` - sends the token to other experts, and the
loss and gradients jump by far more than the noise that caused it (bench/RESULTS.md section 11, eighth session:
tiny DeepSeek-V3 bf16, router 1 token 20 at a group margin of 4.8e-4 flips under Inductor; that one flip is 93%
of the compiled loss's distance to the fp32 run, and plain Inductor fails the single-batch criterion on 8 of 24
batches). A criterion that compares one such sample judges which side of a tie the noise fell on, not whether
the compiled program rounds and accumulates as accurately as eager.

How: `record_routing` runs a model (eager) and keeps every choice its routers made; `hold_routing` makes a model
take exactly those choices. Each router still runs its own code (its logits and scores are what the program
under test computes); only the chosen experts are replaced by the recorded ones, and the weights are the
router's own rule applied to them (gather the scores of the held experts, normalise, scale - the ops the router
applies to its own top-k, in the same order, so holding a router to the choice it makes anyway changes no bit).
DeepSeek-V4's sparse-attention indexer (a top-k over compressed entries, used only as a mask) is held the same
way; V4's hash routers choose by token id and need nothing. With every program of a comparison (compiled, eager
bf16, the fp32 reference) held to one choice, what remains between them is rounding and accumulation only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4
from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3


def _sigmoid_router_weights(router: torch.nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3's rule (`DeepseekV3TopkRouter.forward`): sigmoid scores of the experts, normalised, scaled."""
    weights = logits.sigmoid().gather(1, indices)
    if router.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * router.routed_scaling_factor


def _v4_router_weights(router: torch.nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V4's rule (`DeepseekV4TopKRouter.forward`): `score_fn` scores of the experts, normalised, scaled."""
    weights = router.score_fn(logits).gather(1, indices)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * router.routed_scaling_factor


def _softmax_router_weights(router: torch.nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Qwen3-MoE's rule (`Qwen3MoeTopKRouter.forward`): fp32 softmax probabilities of the experts [normalised]."""
    weights = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1).gather(1, indices)
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)


# Router classes -> the rule that turns (logits, chosen experts) into the weights; each returns
# (logits, weights, indices). None: a selection returned as indices alone (V4's indexer).
_RULES: dict[type, Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None] = {
    v3.DeepseekV3TopkRouter: _sigmoid_router_weights,
    v4.DeepseekV4TopKRouter: _v4_router_weights,
    qwen3.Qwen3MoeTopKRouter: _softmax_router_weights,
    v4.DeepseekV4Indexer: None,
}

_HELD = "trex_held_choice"


def routing_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules of `model` that make a top-k choice this file can record and hold, in module order."""
    return [(name, m) for name, m in model.named_modules() if type(m) in _RULES]


def _indices(output: Any) -> torch.Tensor:
    return output[2] if isinstance(output, tuple) else output


@torch.no_grad()
def record_routing(model: torch.nn.Module, run: Callable[[torch.nn.Module], Any]) -> dict[str, torch.Tensor]:
    """Every choice `model`'s routers make while `run(model)` runs (one call each), by module name."""
    modules = routing_modules(model)
    if not modules:
        known = ", ".join(c.__name__ for c in _RULES)
        raise ValueError(f"{type(model).__name__} has no router this file knows ({known}): nothing to record")
    choices: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:  # returns None: the output stays
            choices.setdefault(name, _indices(output).clone())

        return hook

    hooks = [m.register_forward_hook(keep(name)) for name, m in modules]
    try:
        run(model)
    finally:
        for hook in hooks:
            hook.remove()
    return choices


def _held_forward(module: torch.nn.Module, original: Callable[..., Any]) -> Callable[..., Any]:
    rule = _RULES[type(module)]

    def forward(*args: Any, **kwargs: Any) -> Any:
        output = original(*args, **kwargs)
        held = getattr(module, _HELD)
        if rule is None:
            return held
        logits, _, indices = output
        if held.shape != indices.shape:
            raise ValueError(
                f"held choice of shape {tuple(held.shape)} for a router choosing {tuple(indices.shape)}: "
                "record the choices on the same batch shape"
            )
        return logits, rule(module, logits, held), held

    return forward


def hold_routing(model: torch.nn.Module, choices: dict[str, torch.Tensor]) -> torch.nn.Module:
    """Make each of `model`'s routers choose what `choices` (from `record_routing`) says, and return `model`.

    The choice is a non-persistent buffer of the router (a graph input when the model is compiled, so the compiled
    program holds it too); call this before the model's first compiled call, and on each copy separately (a copy
    of a held model does not carry the wrapped forward)."""
    modules = dict(routing_modules(model))
    if set(modules) != set(choices):
        raise ValueError(
            f"the choices name routers the model lacks ({sorted(set(choices) - set(modules))}) or miss some of its "
            f"routers ({sorted(set(modules) - set(choices))}): record them on a model of the same structure"
        )
    for name, module in modules.items():
        module.register_buffer(_HELD, choices[name].clone(), persistent=False)
        module.forward = _held_forward(module, module.forward)
    return model


def set_held_routing(model: torch.nn.Module, choices: dict[str, torch.Tensor]) -> None:
    """Replace the choices a model held by `hold_routing` takes, in place (same shapes: a compiled program reads
    them as inputs, so it holds the new choices without recompiling)."""
    for name, module in routing_modules(model):
        getattr(module, _HELD).copy_(choices[name])
