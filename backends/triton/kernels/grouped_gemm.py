"""Grouped GEMM for MoE experts with a variable number of rows per expert (rows sorted by expert,
`offsets[e]` the end of expert e's rows, as `trex.grouped_mm` defines them): no padding, no per-
expert launches. One program computes one (expert, row tile, column tile) block; tiles past an
expert's last row exit at once. The weight gradient walks each expert's rows in tiles.

    grouped_mm(x[S,K], w[E,K,N], offsets[E]) -> y[S,N],   y[rows of e] = x[rows of e] @ w[e]
    grouped_mm_weight_grad(x[S,K], dy[S,N], offsets[E]) -> dw[E,K,N],   dw[e] = x[rows of e]^T @ dy[rows of e]
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

BLOCK_M, BLOCK_N, BLOCK_K = 32, 32, 32


def _bounds(offsets: Tensor) -> list[tuple[int, int]]:
    ends = offsets.tolist()
    return list(zip([0, *ends[:-1]], ends))


def grouped_mm_reference(x: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    out = x.new_zeros(x.size(0), w.size(-1), dtype=torch.promote_types(x.dtype, w.dtype))
    for expert, (start, end) in enumerate(_bounds(offsets)):
        if end > start:
            out[start:end] = x[start:end] @ w[expert]
    return out


def grouped_mm_weight_grad_reference(x: Tensor, dy: Tensor, offsets: Tensor) -> Tensor:
    out = x.new_zeros(offsets.numel(), x.size(1), dy.size(1), dtype=torch.promote_types(x.dtype, dy.dtype))
    for expert, (start, end) in enumerate(_bounds(offsets)):
        if end > start:
            out[expert] = x[start:end].t() @ dy[start:end]
    return out


# The kernels' bodies: plain functions that `_kernels` hands to triton.jit when first used (so TRITON_INTERPRET
# is read then), at module level because Triton's interpreter patches `tl` in the function's globals.


def _forward_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    offsets_ptr,
    K,
    N,
    stride_we,
    stride_wk,
    stride_wn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    IEEE: tl.constexpr,
):
    expert = tl.program_id(0)
    start = tl.load(offsets_ptr + expert - 1, mask=expert > 0, other=0)
    end = tl.load(offsets_ptr + expert)
    row0 = start + tl.program_id(1) * BM
    if row0 < end:
        rows = row0 + tl.arange(0, BM)
        cols = tl.program_id(2) * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            ks = k0 + tl.arange(0, BK)
            a = tl.load(
                x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < end) & (ks[None, :] < K), other=0.0
            )
            b = tl.load(
                w_ptr + expert * stride_we + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                mask=(ks[:, None] < K) & (cols[None, :] < N),
                other=0.0,
            )
            if IEEE:
                acc += tl.dot(a, b, input_precision="ieee")
            else:
                acc += tl.dot(a, b)
        tl.store(
            y_ptr + rows[:, None] * N + cols[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=(rows[:, None] < end) & (cols[None, :] < N),
        )


def _weight_grad_kernel(
    x_ptr, dy_ptr, dw_ptr, offsets_ptr, K, N, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr
):
    expert = tl.program_id(0)
    start = tl.load(offsets_ptr + expert - 1, mask=expert > 0, other=0)
    end = tl.load(offsets_ptr + expert)
    ks = tl.program_id(1) * BK + tl.arange(0, BK)
    cols = tl.program_id(2) * BN + tl.arange(0, BN)
    acc = tl.zeros((BK, BN), dtype=tl.float32)
    for row0 in range(start, end, BM):
        rows = row0 + tl.arange(0, BM)
        a = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < end) & (ks[None, :] < K), other=0.0)
        b = tl.load(
            dy_ptr + rows[:, None] * N + cols[None, :], mask=(rows[:, None] < end) & (cols[None, :] < N), other=0.0
        )
        if IEEE:
            acc += tl.dot(tl.trans(a), b, input_precision="ieee")
        else:
            acc += tl.dot(tl.trans(a), b)
    tl.store(
        dw_ptr + expert * K * N + ks[:, None] * N + cols[None, :],
        acc.to(dw_ptr.dtype.element_ty),
        mask=(ks[:, None] < K) & (cols[None, :] < N),
    )


@functools.cache
def _kernels(interpreted: bool):  # keyed by TRITON_INTERPRET: jit reads it when it wraps
    return triton, triton.jit(_forward_kernel), triton.jit(_weight_grad_kernel)


def _check(x: Tensor, w_or_dy: Tensor, offsets: Tensor, what: str) -> None:
    if x.dim() != 2 or offsets.dim() != 1:
        raise ValueError(
            f"trex_triton.{what}: x must be [rows, K] and offsets [experts]; "
            f"got {tuple(x.shape)} and {tuple(offsets.shape)}"
        )


@torch.library.custom_op("trex_triton::grouped_mm", mutates_args=())
def grouped_mm(x: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    _check(x, w, offsets, "grouped_mm")
    if w.dim() != 3 or w.size(1) != x.size(1) or w.size(0) != offsets.numel():
        raise ValueError(
            f"trex_triton.grouped_mm: w must be [experts={offsets.numel()}, K={x.size(1)}, N]; got {tuple(w.shape)}"
        )
    if not kernels_run_on(x):
        return grouped_mm_reference(x, w, offsets)
    triton, forward, _ = _kernels(interpreting())
    rows, k = x.shape
    n = w.size(2)
    y = torch.empty(rows, n, dtype=torch.promote_types(x.dtype, w.dtype), device=x.device)
    grid = (offsets.numel(), triton.cdiv(max(rows, 1), BLOCK_M), triton.cdiv(n, BLOCK_N))
    forward[grid](
        x.contiguous(),
        w,
        y,
        offsets.to(torch.int32),
        k,
        n,
        w.stride(0),
        w.stride(1),
        w.stride(2),
        BM=BLOCK_M,
        BN=BLOCK_N,
        BK=BLOCK_K,
        IEEE=x.dtype == torch.float32,
    )
    return y


@grouped_mm.register_fake
def _(x, w, offsets):
    return x.new_empty(x.size(0), w.size(2), dtype=torch.promote_types(x.dtype, w.dtype))


@torch.library.custom_op("trex_triton::grouped_mm_weight_grad", mutates_args=())
def grouped_mm_weight_grad(x: Tensor, dy: Tensor, offsets: Tensor) -> Tensor:
    _check(x, dy, offsets, "grouped_mm_weight_grad")
    if not kernels_run_on(x):
        return grouped_mm_weight_grad_reference(x, dy, offsets)
    triton, _, weight_grad = _kernels(interpreting())
    k, n = x.size(1), dy.size(1)
    dw = torch.empty(offsets.numel(), k, n, dtype=torch.promote_types(x.dtype, dy.dtype), device=x.device)
    grid = (offsets.numel(), triton.cdiv(k, BLOCK_K), triton.cdiv(n, BLOCK_N))
    weight_grad[grid](
        x.contiguous(),
        dy.contiguous(),
        dw,
        offsets.to(torch.int32),
        k,
        n,
        BM=BLOCK_M,
        BN=BLOCK_N,
        BK=BLOCK_K,
        IEEE=x.dtype == torch.float32,
    )
    return dw


@grouped_mm_weight_grad.register_fake
def _(x, dy, offsets):
    return x.new_empty(offsets.numel(), x.size(1), dy.size(1), dtype=torch.promote_types(x.dtype, dy.dtype))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, w, offsets = ctx.saved_tensors
    grad = grad.contiguous()
    dx = grouped_mm(grad, w.transpose(1, 2), offsets) if ctx.needs_input_grad[0] else None
    dw = grouped_mm_weight_grad(x, grad, offsets) if ctx.needs_input_grad[1] else None
    return dx, dw, None


grouped_mm.register_autograd(_backward, setup_context=_setup)
