"""MoE router top-k: scores, aux-free-bias selection (optionally group-limited), gathered and normalised
weights, in one pass per token; and the same weights for experts chosen elsewhere (hash routing).

    router_topk(logits[T,E], bias[E] | None, k, score, normalize, eps, scale, n_group=1, topk_group=1)
        -> weights[T,k] fp32, indices[T,k]
    router_weights(logits[T,E], indices[T,k], score, normalize, eps, scale) -> weights[T,k] fp32

Meaning (transformers' Qwen3-MoE, DeepSeek-V3 and DeepSeek-V4 routers):

    scores  = score(logits)                        softmax over experts | sigmoid | sqrt(softplus)
    choice  = scores + bias                        the aux-loss-free balancing bias moves the choice only
    if n_group > 1 (DeepSeek-V3's group-limited routing): the E experts form n_group equal groups; a group's
              score is the sum of its two largest choices; experts outside the topk_group best groups are
              excluded (choice = -inf)
    indices = topk(choice, k)                      (router_weights: given, e.g. DeepSeek-V4's tid2eid[token])
    weights = scores[indices]                      (gathered from the unbiased scores)
    weights = weights / (sum(weights) + eps)       if normalize
    weights = weights * scale                      (routed_scaling_factor)

in fp32, the k slots in descending order of the (masked) choice. Ties: where equal choices compete for the
last slots, the kernel takes the lower expert id (and the lower group id among equal group scores) - the
rule of CUDA's torch.topk, which keeps every value above the k-th and then the k-th value's occurrences in
index order (aten/src/ATen/native/cuda/TensorTopK.cu, gatherTopK). The reference (what the op runs where
the kernel does not: a CPU without TRITON_INTERPRET) calls torch.topk itself, so it selects exactly as
eager does on that device - on a CPU that is std::nth_element's order, which on exact ties is not the
lowest id.

Only the logits are differentiated: the bias is a buffer that the balancing rule updates outside
autograd, and the indices are integers. One program owns one token's row of E experts (laid out as
n_group x group-size in registers): the selections are rounds of max + first-argmax (k and topk_group are
small: 1-8); the backward recomputes the scores from the logits rather than saving a [T,E] matrix, and
adds the gradients of slots that name the same expert (a hash table may repeat one).
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


def _group_mask(choice: Tensor, n_group: int, topk_group: int) -> Tensor:
    """True for the experts of each token's topk_group best groups (a group scores the sum of its two
    largest choices), computed with the ops transformers' DeepSeek-V3 router uses, so it ties as they do."""
    tokens, experts = choice.shape
    group_scores = choice.view(tokens, n_group, experts // n_group).topk(2, dim=-1)[0].sum(dim=-1)
    chosen = torch.topk(group_scores, topk_group, dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, chosen, True)
    return keep.unsqueeze(-1).expand(tokens, n_group, experts // n_group).reshape(tokens, experts)


def _weights(scores: Tensor, indices: Tensor, normalize: bool, eps: float, scale: float) -> Tensor:
    weights = scores.gather(1, indices)
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + eps)
    return weights * scale


def router_topk_reference(
    logits: Tensor,
    bias: Tensor | None,
    top_k: int,
    score: str,
    normalize: bool,
    eps: float,
    scale: float,
    n_group: int = 1,
    topk_group: int = 1,
) -> tuple[Tensor, Tensor]:
    scores = _scores(logits, score)
    choice = scores if bias is None else scores + bias.float()
    if n_group > 1:
        choice = choice.masked_fill(~_group_mask(choice, n_group, topk_group), float("-inf"))
    indices = torch.topk(choice, top_k, dim=-1, sorted=True).indices
    return _weights(scores, indices, normalize, eps, scale), indices


def router_weights_reference(
    logits: Tensor, indices: Tensor, score: str, normalize: bool, eps: float, scale: float
) -> Tensor:
    return _weights(_scores(logits, score), indices, normalize, eps, scale)


def _check(logits: Tensor, bias: Tensor | None, top_k: int, score: str, n_group: int = 1, topk_group: int = 1) -> None:
    if logits.dim() != 2:
        raise ValueError(f"trex_triton.router_topk takes logits [tokens, experts], got {tuple(logits.shape)}")
    if score not in SCORES:
        raise ValueError(f"trex_triton.router_topk: score must be one of {SCORES}, got {score!r}")
    experts = logits.size(1)
    if not 1 <= top_k <= experts:
        raise ValueError(f"trex_triton.router_topk: top_k must lie in [1, {experts}] experts, got {top_k}")
    if bias is not None and tuple(bias.shape) != (experts,):
        raise ValueError(f"trex_triton.router_topk: bias must be [{experts}], got {tuple(bias.shape)}")
    if n_group < 1 or experts % n_group:
        raise ValueError(
            f"trex_triton.router_topk: n_group must divide the {experts} experts into equal groups, got {n_group}"
        )
    if n_group > 1:
        size = experts // n_group
        if size < 2:
            raise ValueError(
                f"trex_triton.router_topk: a group scores its two best experts, so groups need >= 2 experts; "
                f"{experts} experts in {n_group} groups leave {size}: use fewer groups"
            )
        if not 1 <= topk_group <= n_group:
            raise ValueError(f"trex_triton.router_topk: topk_group must lie in [1, {n_group}], got {topk_group}")
        if top_k > topk_group * size:
            raise ValueError(
                f"trex_triton.router_topk: top_k={top_k} exceeds the {topk_group * size} experts of the "
                f"topk_group={topk_group} groups kept; raise topk_group or lower top_k"
            )


def _check_indices(logits: Tensor, indices: Tensor) -> None:
    if logits.dim() != 2 or indices.dim() != 2 or indices.size(0) != logits.size(0):
        raise ValueError(
            "trex_triton.router_weights takes logits [tokens, experts] and indices [tokens, k], got "
            f"{tuple(logits.shape)} and {tuple(indices.shape)}"
        )
    if indices.dtype != torch.int64:
        raise ValueError(
            f"trex_triton.router_weights: indices must be int64 (as torch.gather takes), got {indices.dtype}"
        )


# Kernel bodies: plain functions that `_kernels` hands to triton.jit when first used (so TRITON_INTERPRET
# is read then), at module level because Triton's interpreter patches `tl` in the function's globals.


def _scores_body(x, valid, SCORE: tl.constexpr):
    """The scores of a token's logits `x` [rows, columns] (softmax normalises over both axes). The kernels
    call it as `_scores_of`, which `_kernels` sets to its jitted form (Triton calls only jitted helpers)."""
    if SCORE == 0:  # softmax
        x = tl.where(valid, x, float("-inf"))
        e = tl.exp(x - tl.max(tl.max(x, axis=1), axis=0))
        scores = e / tl.sum(tl.sum(e, axis=1), axis=0)
    elif SCORE == 1:  # sigmoid
        scores = tl.sigmoid(x)
    else:  # sqrt(softplus), softplus as torch computes it (linear above its threshold 20)
        scores = tl.sqrt(tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0)))))
    return scores


def _forward_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    indices_ptr,
    E,
    group_size,
    n_group,
    eps,
    scale,
    TOP_K: tl.constexpr,
    K_BLOCK: tl.constexpr,
    SCORE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NORMALIZE: tl.constexpr,
    TOPK_GROUP: tl.constexpr,  # 0: no group limit
    G_BLOCK: tl.constexpr,
    S_BLOCK: tl.constexpr,
    GIVEN: tl.constexpr,  # the experts are read from indices_ptr (router_weights), not chosen
):
    token = tl.program_id(0)
    groups = tl.arange(0, G_BLOCK)
    members = tl.arange(0, S_BLOCK)
    experts = groups[:, None] * group_size + members[None, :]  # [G_BLOCK, S_BLOCK]: the row as its groups
    valid = (groups[:, None] < n_group) & (members[None, :] < group_size)
    x = tl.load(logits_ptr + token * E + experts, mask=valid, other=0.0).to(tl.float32)
    scores = _scores_of(x, valid, SCORE)
    choice = scores
    if HAS_BIAS:
        choice = choice + tl.load(bias_ptr + experts, mask=valid, other=0.0).to(tl.float32)
    choice = tl.where(valid, choice, float("-inf"))
    if TOPK_GROUP > 0:  # a group's score: its two largest choices summed (the first argmax removed once)
        first = tl.max(choice, axis=1)
        first_at = tl.min(tl.where(choice == first[:, None], members[None, :], S_BLOCK), axis=1)
        second = tl.max(tl.where(members[None, :] == first_at[:, None], float("-inf"), choice), axis=1)
        group_score = tl.where(groups < n_group, first + second, float("-inf"))
        kept = groups < 0
        for _ in range(TOPK_GROUP):
            best = tl.max(group_score, axis=0)
            at = tl.min(tl.where(group_score == best, groups, G_BLOCK), axis=0)
            kept = kept | (groups == at)
            group_score = tl.where(groups == at, float("-inf"), group_score)
        choice = tl.where(kept[:, None], choice, float("-inf"))
    slots = tl.arange(0, K_BLOCK)
    picked = tl.zeros((K_BLOCK,), dtype=tl.int32)
    weights = tl.zeros((K_BLOCK,), dtype=tl.float32)
    for slot in range(TOP_K):
        if GIVEN:
            index = tl.load(indices_ptr + token * TOP_K + slot).to(tl.int32)
        else:
            best = tl.max(tl.max(choice, axis=1), axis=0)
            index = tl.min(tl.min(tl.where(choice == best, experts, G_BLOCK * S_BLOCK), axis=1), axis=0)
        chosen = (experts == index) & valid  # a padded member's id repeats the next group's first expert
        picked = tl.where(slots == slot, index, picked)
        weight = tl.sum(tl.sum(tl.where(chosen, scores, 0.0), axis=1), axis=0)
        weights = tl.where(slots == slot, weight, weights)
        choice = tl.where(chosen, float("-inf"), choice)
    if NORMALIZE:
        weights = weights / (tl.sum(weights, axis=0) + eps)
    tl.store(weights_ptr + token * TOP_K + slots, weights * scale, mask=slots < TOP_K)
    if not GIVEN:
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
    experts = tl.arange(0, E_BLOCK)[None, :]
    valid = experts < E
    x = tl.load(logits_ptr + token * E + experts, mask=valid, other=0.0).to(tl.float32)
    scores = _scores_of(x, valid, SCORE)  # [1, E_BLOCK]
    slots = tl.arange(0, K_BLOCK)
    in_k = slots < TOP_K
    index = tl.load(indices_ptr + token * TOP_K + slots, mask=in_k, other=-1)
    grad = tl.load(grad_ptr + token * TOP_K + slots, mask=in_k, other=0.0).to(tl.float32) * scale
    hot = index[:, None] == experts  # [K_BLOCK, E_BLOCK]
    selected = tl.sum(tl.where(hot, scores, 0.0), axis=1)
    if NORMALIZE:
        total = tl.sum(selected, axis=0) + eps
        grad = grad / total - tl.sum(grad * selected, axis=0) / (total * total)
    grad_scores = tl.sum(tl.where(hot, grad[:, None], 0.0), axis=0)[None, :]  # repeated experts add up
    if SCORE == 0:
        grad_x = scores * (grad_scores - tl.sum(tl.sum(grad_scores * scores, axis=1), axis=0))
    elif SCORE == 1:
        grad_x = grad_scores * scores * (1.0 - scores)
    else:
        grad_x = grad_scores * tl.sigmoid(x) / (2.0 * scores)
    tl.store(grad_logits_ptr + token * E + experts, grad_x.to(grad_logits_ptr.dtype.element_ty), mask=valid)


_scores_of = None  # the jitted `_scores_body` the kernels call; set by `_kernels`


@functools.cache
def _kernels(interpreted: bool):  # keyed by TRITON_INTERPRET: jit reads it when it wraps
    global _scores_of
    _scores_of = triton.jit(_scores_body)
    return triton, triton.jit(_forward_kernel), triton.jit(_backward_kernel)


def _launch_forward(
    logits: Tensor,
    bias: Tensor | None,
    indices: Tensor,
    given: bool,
    score: str,
    normalize: bool,
    eps: float,
    scale: float,
    n_group: int,
    topk_group: int,
) -> Tensor:
    """The forward kernel over every token: the weights [T,k]; `indices` [T,k] is written (the experts chosen)
    or, with `given`, read."""
    triton, forward, _ = _kernels(interpreting())
    tokens, experts = logits.shape
    top_k = indices.size(1)
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    group_size = experts // n_group
    if tokens:
        forward[(tokens,)](
            logits.contiguous(),
            logits if bias is None else bias.contiguous(),  # unread without a bias
            weights,
            indices,
            experts,
            group_size,
            n_group,
            eps,
            scale,
            TOP_K=top_k,
            K_BLOCK=triton.next_power_of_2(top_k),
            SCORE=_SCORE_CODE[score],
            HAS_BIAS=bias is not None,
            NORMALIZE=normalize,
            TOPK_GROUP=topk_group if n_group > 1 else 0,
            G_BLOCK=triton.next_power_of_2(n_group),
            S_BLOCK=triton.next_power_of_2(group_size),
            GIVEN=given,
        )
    return weights


@torch.library.custom_op("trex_triton::router_topk", mutates_args=())
def router_topk(
    logits: Tensor,
    bias: Tensor | None,
    top_k: int,
    score: str,
    normalize: bool,
    eps: float,
    scale: float,
    n_group: int = 1,
    topk_group: int = 1,
) -> tuple[Tensor, Tensor]:
    """(weights[T,k] fp32, indices[T,k] int64): see the module docstring."""
    _check(logits, bias, top_k, score, n_group, topk_group)
    if not kernels_run_on(logits):
        return router_topk_reference(logits, bias, top_k, score, normalize, eps, scale, n_group, topk_group)
    indices = torch.empty(logits.size(0), top_k, dtype=torch.int64, device=logits.device)
    weights = _launch_forward(logits, bias, indices, False, score, normalize, eps, scale, n_group, topk_group)
    return weights, indices


@router_topk.register_fake
def _(logits, bias, top_k, score, normalize, eps, scale, n_group=1, topk_group=1):
    _check(logits, bias, top_k, score, n_group, topk_group)
    tokens = logits.size(0)
    return logits.new_empty(tokens, top_k, dtype=torch.float32), logits.new_empty(tokens, top_k, dtype=torch.int64)


@torch.library.custom_op("trex_triton::router_weights", mutates_args=())
def router_weights(logits: Tensor, indices: Tensor, score: str, normalize: bool, eps: float, scale: float) -> Tensor:
    """weights[T,k] fp32 of the experts `indices` names (chosen outside the router: DeepSeek-V4's hash layers).
    Indices outside [0, E) are the caller's error: the reference's gather raises; the kernel (which cannot
    raise without a host sync) gives them weight 0."""
    _check_indices(logits, indices)
    if score not in SCORES:
        raise ValueError(f"trex_triton.router_weights: score must be one of {SCORES}, got {score!r}")
    if not kernels_run_on(logits):
        return router_weights_reference(logits, indices, score, normalize, eps, scale)
    return _launch_forward(logits, None, indices.contiguous(), True, score, normalize, eps, scale, 1, 1)


@router_weights.register_fake
def _(logits, indices, score, normalize, eps, scale):
    _check_indices(logits, indices)
    return logits.new_empty(indices.shape, dtype=torch.float32)


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
    grad_scores = torch.zeros_like(scores).scatter_add(1, indices, grad)  # slots naming one expert add up
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
    """The gradient of the logits (the scores recomputed from them), for router_topk and router_weights."""
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
    logits, _, _, score, normalize, eps, scale, *_groups = inputs
    ctx.save_for_backward(logits, output[1])
    ctx.attributes = (score, normalize, eps, scale)


def _backward(ctx, grad_weights, _grad_indices):
    logits, indices = ctx.saved_tensors
    grad_logits = router_topk_backward(grad_weights.contiguous(), logits, indices, *ctx.attributes)
    return grad_logits, None, None, None, None, None, None, None, None


router_topk.register_autograd(_backward, setup_context=_setup)


def _setup_weights(ctx, inputs, output):
    logits, indices, score, normalize, eps, scale = inputs
    ctx.save_for_backward(logits, indices)
    ctx.attributes = (score, normalize, eps, scale)


def _backward_weights(ctx, grad_weights):
    logits, indices = ctx.saved_tensors
    grad_logits = router_topk_backward(grad_weights.contiguous(), logits, indices, *ctx.attributes)
    return grad_logits, None, None, None, None, None


router_weights.register_autograd(_backward_weights, setup_context=_setup_weights)
