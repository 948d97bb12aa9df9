"""MoE router top-k: scores, aux-free-bias selection, gathered and normalised weights, in one pass per token.

    router_topk(logits[T,E], bias[E] | None, k, score, normalize, eps, scale) -> weights[T,k] fp32, indices[T,k]

Meaning (transformers' Qwen3-MoE, DeepSeek-V3 without group-limited routing, and DeepSeek-V4 routers):

    scores  = score(logits)                        softmax over experts | sigmoid | sqrt(softplus)
    indices = topk(scores + bias, k)               the aux-loss-free balancing bias moves the choice only
    weights = scores[indices]                      (gathered from the unbiased scores)
    weights = weights / (sum(weights) + eps)       if normalize
    weights = weights * scale

in fp32, the k slots in descending order of the biased score (the lower expert id first on a tie).
Only the logits are differentiated: the bias is a buffer that the balancing rule updates outside
autograd. One program owns one token's row of E experts: the k selections are k rounds of
max + first-argmax over the row held in registers (k is small: 2-8); the backward recomputes the
scores from the logits rather than saving a [T,E] matrix.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from trex.backends.triton.availability import interpreting, kernels_run_on

try:
    import triton
    import triton.language as tl
except ImportError:  # the ops run their references; availability says why
    triton = tl = None

SCORES = ("softmax", "sigmoid", "sqrtsoftplus")
_SCORE_CODE = {name: i for i, name in enumerate(SCORES)}


def _scores(logits: Tensor, score: str) -> Tensor:
    x = logits.float()
    if score == "softmax":
        return torch.softmax(x, dim=-1)
    if score == "sigmoid":
        return torch.sigmoid(x)
    return F.softplus(x).sqrt()


def router_topk_reference(
    logits: Tensor, bias: Tensor | None, top_k: int, score: str, normalize: bool, eps: float, scale: float
) -> tuple[Tensor, Tensor]:
    scores = _scores(logits, score)
    choice = scores if bias is None else scores + bias.float()
    indices = torch.topk(choice, top_k, dim=-1, sorted=True).indices
    weights = scores.gather(1, indices)
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + eps)
    return weights * scale, indices


def _check(logits: Tensor, bias: Tensor | None, top_k: int, score: str) -> None:
    if logits.dim() != 2:
        raise ValueError(f"trex_triton.router_topk takes logits [tokens, experts], got {tuple(logits.shape)}")
    if score not in SCORES:
        raise ValueError(f"trex_triton.router_topk: score must be one of {SCORES}, got {score!r}")
    if not 1 <= top_k <= logits.size(1):
        raise ValueError(f"trex_triton.router_topk: top_k must lie in [1, {logits.size(1)}] experts, got {top_k}")
    if bias is not None and tuple(bias.shape) != (logits.size(1),):
        raise ValueError(f"trex_triton.router_topk: bias must be [{logits.size(1)}], got {tuple(bias.shape)}")


# Kernel bodies: plain functions that `_kernels` hands to triton.jit when first used (so TRITON_INTERPRET
# is read then), at module level because Triton's interpreter patches `tl` in the function's globals.


def _forward_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    indices_ptr,
    E,
    eps,
    scale,
    TOP_K: tl.constexpr,
    K_BLOCK: tl.constexpr,
    SCORE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NORMALIZE: tl.constexpr,
    E_BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    experts = tl.arange(0, E_BLOCK)
    valid = experts < E
    x = tl.load(logits_ptr + token * E + experts, mask=valid, other=0.0).to(tl.float32)
    if SCORE == 0:  # softmax
        x = tl.where(valid, x, float("-inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        scores = e / tl.sum(e, axis=0)
    elif SCORE == 1:  # sigmoid
        scores = tl.sigmoid(x)
    else:  # sqrt(softplus), softplus as torch computes it (linear above 20)
        scores = tl.sqrt(tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0)))))
    choice = scores
    if HAS_BIAS:
        choice = choice + tl.load(bias_ptr + experts, mask=valid, other=0.0).to(tl.float32)
    choice = tl.where(valid, choice, float("-inf"))
    slots = tl.arange(0, K_BLOCK)
    picked = tl.zeros((K_BLOCK,), dtype=tl.int32)
    weights = tl.zeros((K_BLOCK,), dtype=tl.float32)
    for slot in range(TOP_K):
        best = tl.max(choice, axis=0)
        index = tl.min(tl.where(choice == best, experts, E_BLOCK), axis=0)
        chosen = experts == index
        picked = tl.where(slots == slot, index, picked)
        weights = tl.where(slots == slot, tl.sum(tl.where(chosen, scores, 0.0), axis=0), weights)
        choice = tl.where(chosen, float("-inf"), choice)
    if NORMALIZE:
        weights = weights / (tl.sum(weights, axis=0) + eps)
    tl.store(weights_ptr + token * TOP_K + slots, weights * scale, mask=slots < TOP_K)
    tl.store(indices_ptr + token * TOP_K + slots, picked.to(tl.int64), mask=slots < TOP_K)


def _backward_kernel(
    grad_ptr,
    logits_ptr,
    indices_ptr,
    grad_logits_ptr,
    E,
    eps,
    scale,
    TOP_K: tl.constexpr,
    K_BLOCK: tl.constexpr,
    SCORE: tl.constexpr,
    NORMALIZE: tl.constexpr,
    E_BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    experts = tl.arange(0, E_BLOCK)
    valid = experts < E
    x = tl.load(logits_ptr + token * E + experts, mask=valid, other=0.0).to(tl.float32)
    if SCORE == 0:
        x = tl.where(valid, x, float("-inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        scores = e / tl.sum(e, axis=0)
    elif SCORE == 1:
        scores = tl.sigmoid(x)
    else:
        scores = tl.sqrt(tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0)))))
    slots = tl.arange(0, K_BLOCK)
    in_k = slots < TOP_K
    index = tl.load(indices_ptr + token * TOP_K + slots, mask=in_k, other=-1)
    grad = tl.load(grad_ptr + token * TOP_K + slots, mask=in_k, other=0.0).to(tl.float32) * scale
    hot = index[:, None] == experts[None, :]  # [K_BLOCK, E_BLOCK]
    selected = tl.sum(tl.where(hot, scores[None, :], 0.0), axis=1)
    if NORMALIZE:
        total = tl.sum(selected, axis=0) + eps
        grad = grad / total - tl.sum(grad * selected, axis=0) / (total * total)
    grad_scores = tl.sum(tl.where(hot, grad[:, None], 0.0), axis=0)
    if SCORE == 0:
        grad_x = scores * (grad_scores - tl.sum(grad_scores * scores, axis=0))
    elif SCORE == 1:
        grad_x = grad_scores * scores * (1.0 - scores)
    else:
        grad_x = grad_scores * tl.sigmoid(x) / (2.0 * scores)
    tl.store(grad_logits_ptr + token * E + experts, grad_x.to(grad_logits_ptr.dtype.element_ty), mask=valid)


@functools.cache
def _kernels(interpreted: bool):  # keyed by TRITON_INTERPRET: jit reads it when it wraps
    return triton, triton.jit(_forward_kernel), triton.jit(_backward_kernel)


@torch.library.custom_op("trex_triton::router_topk", mutates_args=())
def router_topk(
    logits: Tensor, bias: Tensor | None, top_k: int, score: str, normalize: bool, eps: float, scale: float
) -> tuple[Tensor, Tensor]:
    """(weights[T,k] fp32, indices[T,k] int64): see the module docstring."""
    _check(logits, bias, top_k, score)
    if not kernels_run_on(logits):
        return router_topk_reference(logits, bias, top_k, score, normalize, eps, scale)
    triton, forward, _ = _kernels(interpreting())
    tokens, experts = logits.shape
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    indices = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    if tokens:
        forward[(tokens,)](
            logits.contiguous(),
            logits if bias is None else bias.contiguous(),  # unread without a bias
            weights,
            indices,
            experts,
            eps,
            scale,
            TOP_K=top_k,
            K_BLOCK=triton.next_power_of_2(top_k),
            SCORE=_SCORE_CODE[score],
            HAS_BIAS=bias is not None,
            NORMALIZE=normalize,
            E_BLOCK=triton.next_power_of_2(experts),
        )
    return weights, indices


@router_topk.register_fake
def _(logits, bias, top_k, score, normalize, eps, scale):
    _check(logits, bias, top_k, score)
    tokens = logits.size(0)
    return logits.new_empty(tokens, top_k, dtype=torch.float32), logits.new_empty(tokens, top_k, dtype=torch.int64)


def router_topk_backward_reference(
    grad_weights: Tensor, logits: Tensor, indices: Tensor, score: str, normalize: bool, eps: float, scale: float
) -> Tensor:
    """The logits' gradient in closed form (no autograd: an op's body runs below the autograd dispatch key,
    where `torch.autograd.grad` would find nothing recorded)."""
    x = logits.float()
    scores = _scores(logits, score)
    weights = scores.gather(1, indices)
    grad = grad_weights.float() * scale
    if normalize:  # w_i / S with S = sum(w) + eps: dS/dw_j = 1
        total = weights.sum(dim=-1, keepdim=True) + eps
        grad = grad / total - (grad * weights).sum(dim=-1, keepdim=True) / total**2
    grad_scores = torch.zeros_like(scores).scatter(1, indices, grad)  # the k indices of a row are distinct
    if score == "softmax":
        grad_x = scores * (grad_scores - (grad_scores * scores).sum(dim=-1, keepdim=True))
    elif score == "sigmoid":
        grad_x = grad_scores * scores * (1 - scores)
    else:  # sqrt(softplus(x)): d/dx = sigmoid(x) / (2 sqrt(softplus(x)))
        grad_x = grad_scores * torch.sigmoid(x) / (2 * scores)
    return grad_x.to(logits.dtype)


@torch.library.custom_op("trex_triton::router_topk_backward", mutates_args=())
def router_topk_backward(
    grad_weights: Tensor, logits: Tensor, indices: Tensor, score: str, normalize: bool, eps: float, scale: float
) -> Tensor:
    """The gradient of the logits (the scores recomputed from them)."""
    if not kernels_run_on(logits):
        return router_topk_backward_reference(grad_weights, logits, indices, score, normalize, eps, scale)
    triton, _, backward = _kernels(interpreting())
    tokens, experts = logits.shape
    top_k = indices.size(1)
    grad_logits = torch.empty(tokens, experts, dtype=logits.dtype, device=logits.device)
    if tokens:
        backward[(tokens,)](
            grad_weights.contiguous(),
            logits.contiguous(),
            indices.contiguous(),
            grad_logits,
            experts,
            eps,
            scale,
            TOP_K=top_k,
            K_BLOCK=triton.next_power_of_2(top_k),
            SCORE=_SCORE_CODE[score],
            NORMALIZE=normalize,
            E_BLOCK=triton.next_power_of_2(experts),
        )
    return grad_logits


@router_topk_backward.register_fake
def _(grad_weights, logits, indices, score, normalize, eps, scale):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


def _setup(ctx, inputs, output):
    logits, _, _, score, normalize, eps, scale = inputs
    ctx.save_for_backward(logits, output[1])
    ctx.attributes = (score, normalize, eps, scale)


def _backward(ctx, grad_weights, _grad_indices):
    logits, indices = ctx.saved_tensors
    grad_logits = router_topk_backward(grad_weights.contiguous(), logits, indices, *ctx.attributes)
    return grad_logits, None, None, None, None, None, None


router_topk.register_autograd(_backward, setup_context=_setup)
