"""Fused SwiGLU, forward and backward: silu(gate) * up in one pass over memory, and both input
gradients in one pass (the sigmoid recomputed, nothing saved but the inputs)."""

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

BLOCK = 1024


def swiglu_reference(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


# The kernels' bodies: plain functions that `_kernels` hands to triton.jit when first used (so TRITON_INTERPRET
# is read then), at module level because Triton's interpreter patches `tl` in the function's globals.


def _forward_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def _backward_kernel(grad_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    grad = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    dgate = grad * up * sig * (1.0 + gate * (1.0 - sig))
    tl.store(dgate_ptr + offsets, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + offsets, (grad * silu).to(dup_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _kernels(interpreted: bool):  # keyed by TRITON_INTERPRET: jit reads it when it wraps
    return triton, triton.jit(_forward_kernel), triton.jit(_backward_kernel)


@torch.library.custom_op("trex_triton::swiglu", mutates_args=())
def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up (same shapes)."""
    if gate.shape != up.shape:
        raise ValueError(
            f"trex_triton.swiglu takes gate and up of one shape, got {tuple(gate.shape)} and {tuple(up.shape)}"
        )
    if not kernels_run_on(gate):
        return swiglu_reference(gate, up)
    triton, forward, _ = _kernels(interpreting())
    out = torch.empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype), device=gate.device)
    n = gate.numel()
    forward[(triton.cdiv(n, BLOCK),)](gate.contiguous(), up.contiguous(), out, n, BLOCK=BLOCK)
    return out


@swiglu.register_fake
def _(gate, up):
    return gate.new_empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype))


@torch.library.custom_op("trex_triton::swiglu_backward", mutates_args=())
def swiglu_backward(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    if not kernels_run_on(gate):
        sig = torch.sigmoid(gate.float())
        g, u, dy = gate.float(), up.float(), grad.float()
        return (dy * u * sig * (1 + g * (1 - sig))).to(gate.dtype), (dy * g * sig).to(up.dtype)
    triton, _, backward = _kernels(interpreting())
    dgate, dup = (
        torch.empty_like(gate, memory_format=torch.contiguous_format),
        torch.empty_like(up, memory_format=torch.contiguous_format),
    )
    n = gate.numel()
    backward[(triton.cdiv(n, BLOCK),)](
        grad.contiguous(), gate.contiguous(), up.contiguous(), dgate, dup, n, BLOCK=BLOCK
    )
    return dgate, dup


@swiglu_backward.register_fake
def _(grad, gate, up):
    return torch.empty_like(gate), torch.empty_like(up)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    return swiglu_backward(grad, gate, up)


swiglu.register_autograd(_backward, setup_context=_setup)
