"""Fused RMSNorm, forward and backward: one program per row, statistics in fp32.

Meaning (transformers' Llama/Qwen3/DeepSeek RMSNorm): y = weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype),
the normalisation computed in fp32. The forward also returns rstd = rsqrt(mean(x^2) + eps) per row
([rows], fp32), which the backward reuses instead of recomputing the reduction.
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


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    hidden = x.float()
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden.to(x.dtype)


# The kernels' bodies: plain functions that `_kernels` hands to triton.jit when first used (so TRITON_INTERPRET
# is read then), at module level because Triton's interpreter patches `tl` in the function's globals.


def _forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    normed = (x * rstd).to(x_ptr.dtype.element_ty)
    tl.store(y_ptr + row * n_cols + cols, (normed * w).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


def _backward_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_rows_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dy = tl.load(dy_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row)
    x_hat = x * rstd
    g = dy * w
    dx = rstd * (g - x_hat * (tl.sum(g * x_hat, axis=0) / n_cols))
    tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_rows_ptr + row * n_cols + cols, dy * x_hat.to(x_ptr.dtype.element_ty).to(tl.float32), mask=mask)


@functools.cache
def _kernels(interpreted: bool):  # keyed by TRITON_INTERPRET: jit reads it when it wraps
    return triton, triton.jit(_forward_kernel), triton.jit(_backward_kernel)


@torch.library.custom_op("trex_triton::rms_norm_forward", mutates_args=())
def rms_norm_forward(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(y, rstd[rows]) of RMSNorm over the last dimension."""
    rows = x.numel() // x.size(-1)
    if not kernels_run_on(x):
        hidden = x.float()
        rstd = torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
        return weight * (hidden * rstd).to(x.dtype), rstd.reshape(rows)
    triton, forward, _ = _kernels(interpreting())
    x2 = x.contiguous().view(rows, x.size(-1))
    y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    forward[(rows,)](x2, weight.contiguous(), y, rstd, x.size(-1), eps, BLOCK=triton.next_power_of_2(x.size(-1)))
    return y, rstd


@rms_norm_forward.register_fake
def _(x, weight, eps):
    rows = x.numel() // x.size(-1)
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype)), x.new_empty(
        rows, dtype=torch.float32
    )


@torch.library.custom_op("trex_triton::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad_y: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    """(dx, dweight) of `rms_norm_forward`."""
    cols = x.size(-1)
    rows = x.numel() // cols
    if not kernels_run_on(x):
        x_hat = x.float().view(rows, cols) * rstd.unsqueeze(-1)
        dy = grad_y.float().reshape(rows, cols)
        g = dy * weight.float()
        dx = rstd.unsqueeze(-1) * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
        dw = (dy * x_hat.to(x.dtype).float()).sum(0)
        return dx.to(x.dtype).view(x.shape), dw.to(weight.dtype)
    triton, _, backward = _kernels(interpreting())
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw_rows = torch.empty(rows, cols, dtype=torch.float32, device=x.device)
    backward[(rows,)](
        grad_y.contiguous(),
        x.contiguous(),
        weight.contiguous(),
        rstd,
        dx,
        dw_rows,
        cols,
        BLOCK=triton.next_power_of_2(cols),
    )
    return dx, dw_rows.sum(0).to(weight.dtype)


@rms_norm_backward.register_fake
def _(grad_y, x, weight, rstd):
    return torch.empty_like(x), torch.empty_like(weight)


def _setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _backward(ctx, grad_y, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_backward(grad_y, x, weight, rstd)
    return dx, dw, None


rms_norm_forward.register_autograd(_backward, setup_context=_setup)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm through the fused kernel (differentiable)."""
    return rms_norm_forward(x, weight, eps)[0]
