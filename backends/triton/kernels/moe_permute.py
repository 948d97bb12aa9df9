"""MoE token permute / unpermute: rows sorted by expert with index maps, padding-free, no host sync.

    moe_permute(hidden[T,H], top_k_index[T,k], E) -> permuted[S,H], perm[S], inverse[S], offsets[E]
    moe_unpermute(expert_out[S,H], inverse[S], top_k_weights[T,k]) -> out[T,H]

S = T*k rows, one per (token, slot). `perm[s]` is the flat index (token * k + slot) of sorted row s and
`inverse` its inverse (`inverse[perm[s]] = s`); rows are sorted by expert, stably (a slot keeps its
flat order among the slots of its expert), so expert e owns rows `offsets[e-1]:offsets[e]`: exactly
`trex.moe_dispatch`'s (sorted_hidden, perm, offsets), plus the inverse map that combine and both
backwards gather through. A slot whose expert id lies outside [0, E) (a dropped slot) is placed after
every expert's rows, in flat order, and no offset counts it.

The permute is a counting sort in two kernels: each block of BLOCK slots counts its slots per expert
(a one-hot [BLOCK, E] sum); a cumulative sum over (block, expert) of those counts, on the device,
gives every block its first row per expert; the second kernel ranks each slot among its block's
slots of the same expert (a cumulative sum down the one-hot) and writes both maps. A third kernel
gathers the rows. No sort, no padding to a capacity, no `.item()`: the row counts stay on the device.

The unpermute gathers each token's k rows through `inverse`, scales them by the routing weights and
sums in fp32; its backward writes each sorted row's gradient (scatter through `inverse`: a
permutation, so no accumulation) and the routing-weight gradient (a dot product per slot) in one
kernel. The permute's backward is the unweighted unpermute.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from trex.backends.triton.availability import interpreting, kernels_run_on

try:
    import triton
    import triton.language as tl
except ImportError:  # the ops run their references; availability says why
    triton = tl = None

SLOTS_PER_BLOCK = 64  # slots one counting program handles
BLOCK_H = 128  # hidden columns one gather program moves


# ---------------------------------------------------------------------------------------------
# References (plain PyTorch, differentiable through autograd)


def _buckets(top_k_index: Tensor, num_experts: int) -> Tensor:
    """Each slot's expert, with every id outside [0, E) mapped to E (dropped slots sort last)."""
    ids = top_k_index.reshape(-1)
    return torch.where((ids >= 0) & (ids < num_experts), ids, torch.full_like(ids, num_experts))


def moe_permute_reference(
    hidden: Tensor, top_k_index: Tensor, num_experts: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    top_k = top_k_index.size(-1)
    buckets = _buckets(top_k_index, num_experts)
    _, perm = torch.sort(buckets, stable=True)
    counts = torch.bincount(buckets, minlength=num_experts + 1)[:num_experts]
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    inverse = torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.numel(), device=perm.device))
    return hidden[perm // top_k], perm, inverse, offsets


def moe_unpermute_reference(expert_out: Tensor, inverse: Tensor, top_k_weights: Tensor) -> Tensor:
    num_tokens, top_k = top_k_weights.shape
    dtype = torch.promote_types(expert_out.dtype, top_k_weights.dtype)
    rows = expert_out[inverse].view(num_tokens, top_k, -1).to(dtype)
    return (rows * top_k_weights.to(dtype).unsqueeze(-1)).sum(dim=1)


# ---------------------------------------------------------------------------------------------
# Kernel bodies: plain functions that `_kernels` hands to triton.jit when first used (so TRITON_INTERPRET
# is read then), at module level because Triton's interpreter patches `tl` in the function's globals.


def _count_kernel(ids_ptr, counts_ptr, S, E, BLOCK: tl.constexpr, E_BLOCK: tl.constexpr):
    block = tl.program_id(0)
    slots = block * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + slots, mask=slots < S, other=-1).to(tl.int32)
    ids = tl.where((ids >= 0) & (ids < E), ids, E)  # bucket E: dropped slots
    ids = tl.where(slots < S, ids, E + 1)  # past the end: no bucket
    experts = tl.arange(0, E_BLOCK)
    hot = (ids[:, None] == experts[None, :]).to(tl.int32)
    tl.store(counts_ptr + block * (E + 1) + experts, tl.sum(hot, axis=0), mask=experts < E + 1)


def _rank_kernel(ids_ptr, starts_ptr, perm_ptr, inverse_ptr, S, E, BLOCK: tl.constexpr, E_BLOCK: tl.constexpr):
    block = tl.program_id(0)
    slots = block * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + slots, mask=slots < S, other=-1).to(tl.int32)
    ids = tl.where((ids >= 0) & (ids < E), ids, E)  # bucket E: dropped slots
    ids = tl.where(slots < S, ids, E + 1)  # past the end: no bucket
    experts = tl.arange(0, E_BLOCK)
    hot = (ids[:, None] == experts[None, :]).to(tl.int32)
    starts = tl.load(starts_ptr + block * (E + 1) + experts, mask=experts < E + 1, other=0)
    before = tl.cumsum(hot, axis=0) - hot  # earlier slots of the same bucket in this block
    row = tl.sum(hot * (starts[None, :] + before), axis=1)
    tl.store(inverse_ptr + slots, row.to(tl.int64), mask=slots < S)
    tl.store(perm_ptr + row, slots.to(tl.int64), mask=slots < S)


def _gather_kernel(src_ptr, perm_ptr, out_ptr, H, TOP_K, BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    token = tl.load(perm_ptr + row) // TOP_K
    values = tl.load(src_ptr + token * H + cols, mask=cols < H)
    tl.store(out_ptr + row * H + cols, values, mask=cols < H)


def _combine_kernel(
    rows_ptr, inverse_ptr, weights_ptr, out_ptr, H, TOP_K, WEIGHTED: tl.constexpr, BLOCK_H: tl.constexpr
):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for slot in range(TOP_K):
        row = tl.load(inverse_ptr + token * TOP_K + slot)
        values = tl.load(rows_ptr + row * H + cols, mask=cols < H, other=0.0).to(tl.float32)
        if WEIGHTED:
            values = values * tl.load(weights_ptr + token * TOP_K + slot).to(tl.float32)
        acc += values
    tl.store(out_ptr + token * H + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < H)


def _unpermute_backward_kernel(
    grad_ptr, rows_ptr, inverse_ptr, weights_ptr, grad_rows_ptr, grad_weights_ptr, H, TOP_K, BLOCK_H: tl.constexpr
):
    token = tl.program_id(0)
    slot = tl.program_id(1)
    row = tl.load(inverse_ptr + token * TOP_K + slot)
    weight = tl.load(weights_ptr + token * TOP_K + slot).to(tl.float32)
    dot = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for start in range(0, H, BLOCK_H):
        cols = start + tl.arange(0, BLOCK_H)
        grad = tl.load(grad_ptr + token * H + cols, mask=cols < H, other=0.0).to(tl.float32)
        values = tl.load(rows_ptr + row * H + cols, mask=cols < H, other=0.0).to(tl.float32)
        tl.store(grad_rows_ptr + row * H + cols, (grad * weight).to(grad_rows_ptr.dtype.element_ty), mask=cols < H)
        dot += grad * values
    tl.store(grad_weights_ptr + token * TOP_K + slot, tl.sum(dot, axis=0).to(grad_weights_ptr.dtype.element_ty))


@functools.cache
def _kernels(interpreted: bool):  # keyed by TRITON_INTERPRET: jit reads it when it wraps
    jit = triton.jit
    return (
        triton,
        jit(_count_kernel),
        jit(_rank_kernel),
        jit(_gather_kernel),
        jit(_combine_kernel),
        jit(_unpermute_backward_kernel),
    )


def _check_permute(hidden: Tensor, top_k_index: Tensor, num_experts: int) -> None:
    if hidden.dim() != 2 or top_k_index.dim() != 2 or hidden.size(0) != top_k_index.size(0):
        raise ValueError(
            "trex_triton.moe_permute takes hidden [tokens, H] and top_k_index [tokens, k]; "
            f"got {tuple(hidden.shape)} and {tuple(top_k_index.shape)}"
        )
    if num_experts < 1:
        raise ValueError(f"trex_triton.moe_permute: num_experts must be >= 1, got {num_experts}")


# ---------------------------------------------------------------------------------------------
# Ops


@torch.library.custom_op("trex_triton::moe_permute", mutates_args=())
def moe_permute(hidden: Tensor, top_k_index: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(permuted[S,H], perm[S], inverse[S], offsets[E] int32): see the module docstring."""
    _check_permute(hidden, top_k_index, num_experts)
    if not kernels_run_on(hidden):
        permuted, perm, inverse, offsets = moe_permute_reference(hidden, top_k_index, num_experts)
        return permuted.contiguous(), perm, inverse, offsets
    triton, count, rank, gather, _, _ = _kernels(interpreting())
    top_k, hidden_size = top_k_index.size(1), hidden.size(1)
    slots = top_k_index.numel()
    ids = top_k_index.contiguous().view(-1)
    blocks = max(triton.cdiv(slots, SLOTS_PER_BLOCK), 1)
    e_block = triton.next_power_of_2(num_experts + 2)  # the experts, the dropped bucket, the past-the-end lanes
    counts = torch.empty(blocks, num_experts + 1, dtype=torch.int32, device=hidden.device)
    count[(blocks,)](ids, counts, slots, num_experts, BLOCK=SLOTS_PER_BLOCK, E_BLOCK=e_block)
    totals = counts.sum(0, dtype=torch.int64)
    bucket_starts = torch.cumsum(totals, 0) - totals  # first row of each bucket
    starts = (bucket_starts + torch.cumsum(counts, 0, dtype=torch.int64) - counts).to(torch.int32)
    perm = torch.empty(slots, dtype=torch.int64, device=hidden.device)
    inverse = torch.empty(slots, dtype=torch.int64, device=hidden.device)
    rank[(blocks,)](ids, starts.contiguous(), perm, inverse, slots, num_experts, BLOCK=SLOTS_PER_BLOCK, E_BLOCK=e_block)
    permuted = torch.empty(slots, hidden_size, dtype=hidden.dtype, device=hidden.device)
    if slots:
        gather[(slots, triton.cdiv(hidden_size, BLOCK_H))](
            hidden.contiguous(), perm, permuted, hidden_size, top_k, BLOCK_H=BLOCK_H
        )
    offsets = torch.cumsum(totals[:num_experts], 0).to(torch.int32)
    return permuted, perm, inverse, offsets


@moe_permute.register_fake
def _(hidden, top_k_index, num_experts):
    _check_permute(hidden, top_k_index, num_experts)
    slots = top_k_index.numel()
    return (
        hidden.new_empty(slots, hidden.size(1)),
        top_k_index.new_empty(slots, dtype=torch.int64),
        top_k_index.new_empty(slots, dtype=torch.int64),
        top_k_index.new_empty(num_experts, dtype=torch.int32),
    )


def _combine(rows: Tensor, inverse: Tensor, weights: Tensor | None, num_tokens: int, dtype: torch.dtype) -> Tensor:
    """out[t] = sum_j (weights[t, j] *) rows[inverse[t*k + j]] in fp32, through the kernel."""
    triton, _, _, _, combine, _ = _kernels(interpreting())
    top_k = inverse.numel() // max(num_tokens, 1)
    hidden_size = rows.size(1)
    out = torch.empty(num_tokens, hidden_size, dtype=dtype, device=rows.device)
    if num_tokens:
        combine[(num_tokens, triton.cdiv(hidden_size, BLOCK_H))](
            rows.contiguous(),
            inverse.contiguous(),
            rows if weights is None else weights.contiguous(),  # unread when unweighted
            out,
            hidden_size,
            top_k,
            WEIGHTED=weights is not None,
            BLOCK_H=BLOCK_H,
        )
    return out


@torch.library.custom_op("trex_triton::moe_permute_backward", mutates_args=())
def moe_permute_backward(grad_permuted: Tensor, inverse: Tensor, num_tokens: int) -> Tensor:
    """The gradient of `hidden`: each token's k sorted-row gradients summed (a gather, no scatter-add)."""
    if not kernels_run_on(grad_permuted):
        top_k = inverse.numel() // num_tokens
        return grad_permuted[inverse].view(num_tokens, top_k, -1).sum(dim=1)
    return _combine(grad_permuted, inverse, None, num_tokens, grad_permuted.dtype)


@moe_permute_backward.register_fake
def _(grad_permuted, inverse, num_tokens):
    return grad_permuted.new_empty(num_tokens, grad_permuted.size(1))


@torch.library.custom_op("trex_triton::moe_unpermute", mutates_args=())
def moe_unpermute(expert_out: Tensor, inverse: Tensor, top_k_weights: Tensor) -> Tensor:
    """out[t] = sum_j top_k_weights[t, j] * expert_out[inverse[t*k + j]], in fp32, in the promoted dtype."""
    if inverse.numel() != top_k_weights.numel() or expert_out.size(0) != inverse.numel():
        raise ValueError(
            f"trex_triton.moe_unpermute: expert_out has {expert_out.size(0)} rows, inverse {inverse.numel()} entries, "
            f"top_k_weights {tuple(top_k_weights.shape)}; all three must describe tokens * k rows"
        )
    dtype = torch.promote_types(expert_out.dtype, top_k_weights.dtype)
    if not kernels_run_on(expert_out):
        return moe_unpermute_reference(expert_out, inverse, top_k_weights)
    return _combine(expert_out, inverse, top_k_weights, top_k_weights.size(0), dtype)


@moe_unpermute.register_fake
def _(expert_out, inverse, top_k_weights):
    dtype = torch.promote_types(expert_out.dtype, top_k_weights.dtype)
    return expert_out.new_empty(top_k_weights.size(0), expert_out.size(1), dtype=dtype)


@torch.library.custom_op("trex_triton::moe_unpermute_backward", mutates_args=())
def moe_unpermute_backward(
    grad_out: Tensor, expert_out: Tensor, inverse: Tensor, top_k_weights: Tensor
) -> tuple[Tensor, Tensor]:
    """(grad of expert_out [S,H], grad of top_k_weights [T,k]) of `moe_unpermute`."""
    num_tokens, top_k = top_k_weights.shape
    if not kernels_run_on(expert_out):
        grad = grad_out.float()
        rows = expert_out[inverse].view(num_tokens, top_k, -1).float()
        grad_rows = (grad.unsqueeze(1) * top_k_weights.float().unsqueeze(-1)).reshape(num_tokens * top_k, -1)
        grad_expert_out = torch.empty_like(expert_out).index_copy_(0, inverse, grad_rows.to(expert_out.dtype))
        return grad_expert_out, (grad.unsqueeze(1) * rows).sum(-1).to(top_k_weights.dtype)
    triton, _, _, _, _, backward = _kernels(interpreting())
    grad_expert_out = torch.empty_like(expert_out, memory_format=torch.contiguous_format)
    grad_weights = torch.empty_like(top_k_weights, memory_format=torch.contiguous_format)
    if num_tokens:
        backward[(num_tokens, top_k)](
            grad_out.contiguous(),
            expert_out.contiguous(),
            inverse.contiguous(),
            top_k_weights.contiguous(),
            grad_expert_out,
            grad_weights,
            expert_out.size(1),
            top_k,
            BLOCK_H=BLOCK_H,
        )
    return grad_expert_out, grad_weights


@moe_unpermute_backward.register_fake
def _(grad_out, expert_out, inverse, top_k_weights):
    return torch.empty_like(expert_out), torch.empty_like(top_k_weights)


def _permute_setup(ctx, inputs, output):
    ctx.save_for_backward(output[2])
    ctx.num_tokens = inputs[0].size(0)


def _permute_backward(ctx, grad_permuted, _grad_perm, _grad_inverse, _grad_offsets):
    (inverse,) = ctx.saved_tensors
    return moe_permute_backward(grad_permuted.contiguous(), inverse, ctx.num_tokens), None, None


def _unpermute_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _unpermute_backward(ctx, grad_out):
    expert_out, inverse, top_k_weights = ctx.saved_tensors
    grad_expert_out, grad_weights = moe_unpermute_backward(grad_out.contiguous(), expert_out, inverse, top_k_weights)
    return grad_expert_out, None, grad_weights


moe_permute.register_autograd(_permute_backward, setup_context=_permute_setup)
moe_unpermute.register_autograd(_unpermute_backward, setup_context=_unpermute_setup)
