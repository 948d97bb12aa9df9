"""Rotary position embedding (the rotate-half convention of transformers' Llama/Qwen3), forward and
backward in one kernel: the backward is the transposed rotation, selected by a compile-time flag.

    y = x * cos + rotate_half(x) * sin,   rotate_half([x1, x2]) = [-x2, x1]

x is [batch, heads, tokens, head_dim]; cos and sin are [batch, tokens, head_dim] (shared by the heads).
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


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_reference(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin


def _rope_transposed_reference(grad: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    g_sin1, g_sin2 = (grad * sin).chunk(2, dim=-1)
    return grad * cos + torch.cat((g_sin2, -g_sin1), dim=-1)


# The kernels' bodies: plain functions that `_kernels` hands to triton.jit when first used (so TRITON_INTERPRET
# is read then), at module level because Triton's interpreter patches `tl` in the function's globals.


def _rotate_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, heads, tokens, half, BLOCK: tl.constexpr, TRANSPOSED: tl.constexpr):
    row = tl.program_id(0)  # (batch, head, token), row-major
    token = row % tokens
    batch = row // (heads * tokens)
    table = (batch * tokens + token) * 2 * half
    cols = tl.arange(0, BLOCK)
    mask = cols < half
    x1 = tl.load(x_ptr + row * 2 * half + cols, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + row * 2 * half + half + cols, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + table + cols, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + table + half + cols, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + table + cols, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + table + half + cols, mask=mask, other=0.0).to(tl.float32)
    if TRANSPOSED:
        y1 = x1 * c1 + x2 * s2
        y2 = x2 * c2 - x1 * s1
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    tl.store(y_ptr + row * 2 * half + cols, y1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + row * 2 * half + half + cols, y2.to(y_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _kernels(interpreted: bool):  # keyed by TRITON_INTERPRET: jit reads it when it wraps
    return triton, triton.jit(_rotate_kernel)


def _check(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    if x.dim() != 4 or cos.shape != sin.shape or cos.shape != (x.size(0), x.size(2), x.size(3)) or x.size(-1) % 2:
        raise ValueError(
            f"trex_triton.rope takes x [batch, heads, tokens, head_dim (even)] and cos, sin [batch, tokens, head_dim]; "
            f"got x {tuple(x.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}"
        )


def _launch(x: Tensor, cos: Tensor, sin: Tensor, transposed: bool) -> Tensor:
    triton, rotate = _kernels(interpreting())
    batch, heads, tokens, dim = x.shape
    y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, cos.dtype), device=x.device)
    rotate[(batch * heads * tokens,)](
        x.contiguous(),
        cos.contiguous(),
        sin.contiguous(),
        y,
        heads,
        tokens,
        dim // 2,
        BLOCK=triton.next_power_of_2(dim // 2),
        TRANSPOSED=transposed,
    )
    return y


@torch.library.custom_op("trex_triton::rope", mutates_args=())
def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    _check(x, cos, sin)
    return _launch(x, cos, sin, False) if kernels_run_on(x) else rope_reference(x, cos, sin)


@rope.register_fake
def _(x, cos, sin):
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, cos.dtype))


@torch.library.custom_op("trex_triton::rope_backward", mutates_args=())
def rope_backward(grad: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    _check(grad, cos, sin)
    return _launch(grad, cos, sin, True) if kernels_run_on(grad) else _rope_transposed_reference(grad, cos, sin)


@rope_backward.register_fake
def _(grad, cos, sin):
    return torch.empty_like(grad)


def _setup(ctx, inputs, output):
    x, cos, sin = inputs
    ctx.save_for_backward(cos, sin)
    ctx.x_dtype = x.dtype


def _backward(ctx, grad):
    cos, sin = ctx.saved_tensors
    return rope_backward(grad, cos, sin).to(ctx.x_dtype), None, None  # cos/sin are position tables, not trained


rope.register_autograd(_backward, setup_context=_setup)
