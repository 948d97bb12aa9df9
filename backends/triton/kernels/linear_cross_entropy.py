"""Fused linear + cross-entropy, chunked over rows: the full [rows, vocab] logits never exist.

For each chunk of rows: logits = h_chunk @ w^T (a GEMM), then one kernel program per row computes the
log-sum-exp in one online pass, the row's loss, and overwrites the logits with their gradient
(softmax - one_hot) / valid_rows; two GEMMs turn that into the chunk's grad_h and its share of
grad_w. The forward therefore returns the gradients too (for an upstream gradient of 1), and the
backward only scales them: the memory is one chunk of logits instead of all of them.

Meaning: F.cross_entropy(h @ w.T, labels, ignore_index=ignore_index) (mean over rows whose label is
not ignore_index), computed in fp32.
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

VOCAB_BLOCK = 1024


def linear_cross_entropy_reference(h: Tensor, w: Tensor, labels: Tensor, ignore_index: int = -100) -> Tensor:
    return F.cross_entropy((h @ w.t()).float(), labels, ignore_index=ignore_index)


# The kernels' bodies: plain functions that `_kernels` hands to triton.jit when first used (so TRITON_INTERPRET
# is read then), at module level because Triton's interpreter patches `tl` in the function's globals.


def _loss_and_grad_kernel(logits_ptr, labels_ptr, loss_ptr, vocab, ignore_index, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    label = tl.load(labels_ptr + row)
    base = logits_ptr + row * vocab
    running_max = tl.full([], float("-inf"), tl.float32)
    running_sum = tl.full([], 0.0, tl.float32)
    for v0 in range(0, vocab, BLOCK):
        cols = v0 + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
        running_max = new_max
    lse = running_max + tl.log(running_sum)
    valid = label != ignore_index
    target = tl.load(base + label, mask=valid, other=0.0).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(valid, lse - target, 0.0))
    for v0 in range(0, vocab, BLOCK):
        cols = v0 + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < vocab, other=0.0).to(tl.float32)
        grad = (tl.exp(x - lse) - tl.where(cols == label, 1.0, 0.0)) * scale
        tl.store(base + cols, tl.where(valid, grad, 0.0), mask=cols < vocab)


@functools.cache
def _kernels(interpreted: bool):  # keyed by TRITON_INTERPRET: jit reads it when it wraps
    return triton.jit(_loss_and_grad_kernel)


def _chunk_loss_and_grad(logits: Tensor, labels: Tensor, ignore_index: int, scale: float) -> Tensor:
    """Row losses; `logits` (fp32) is overwritten with d(loss)/d(logits)."""
    if kernels_run_on(logits):
        losses = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)
        _kernels(interpreting())[(logits.size(0),)](
            logits, labels, losses, logits.size(1), ignore_index, scale, BLOCK=VOCAB_BLOCK
        )
        return losses
    valid = labels != ignore_index
    safe = torch.where(valid, labels, 0)
    lse = torch.logsumexp(logits, dim=-1)
    losses = torch.where(valid, lse - logits.gather(1, safe.unsqueeze(1)).squeeze(1), 0.0)
    logits.sub_(lse.unsqueeze(1)).exp_()
    logits[torch.arange(logits.size(0), device=logits.device), safe] -= 1.0
    logits.mul_(scale * valid.unsqueeze(1))
    return losses


@torch.library.custom_op("trex_triton::linear_cross_entropy_forward", mutates_args=())
def linear_cross_entropy_forward(
    h: Tensor, w: Tensor, labels: Tensor, ignore_index: int, chunk_rows: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(loss, grad_h, grad_w) for an upstream gradient of 1."""
    if h.dim() != 2 or w.dim() != 2 or h.size(1) != w.size(1) or labels.shape != (h.size(0),):
        raise ValueError(
            "trex_triton.linear_cross_entropy takes h [rows, H], w [vocab, H], labels [rows]; "
            f"got {tuple(h.shape)}, {tuple(w.shape)}, {tuple(labels.shape)}"
        )
    if chunk_rows < 1:
        raise ValueError(f"trex_triton.linear_cross_entropy: chunk_rows must be >= 1, got {chunk_rows}")
    valid_rows = int((labels != ignore_index).sum())
    scale = 1.0 / max(valid_rows, 1)
    grad_h = torch.empty_like(h)
    grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    total = torch.zeros((), dtype=torch.float32, device=h.device)
    for start in range(0, h.size(0), chunk_rows):
        h_chunk = h[start : start + chunk_rows]
        logits = (h_chunk @ w.t()).float()
        total += _chunk_loss_and_grad(
            logits, labels[start : start + chunk_rows].contiguous(), ignore_index, scale
        ).sum()
        grad_h[start : start + chunk_rows] = (logits @ w.float()).to(h.dtype)
        grad_w += logits.t() @ h_chunk.float()
    loss = total / valid_rows if valid_rows else total * float("nan")  # F.cross_entropy's mean over no rows is nan
    return loss, grad_h, grad_w.to(w.dtype)


@linear_cross_entropy_forward.register_fake
def _(h, w, labels, ignore_index, chunk_rows):
    return h.new_empty((), dtype=torch.float32), torch.empty_like(h), torch.empty_like(w)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], output[2])


def _backward(ctx, grad_loss, _grad_h, _grad_w):
    grad_h, grad_w = ctx.saved_tensors
    return grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype), None, None, None


linear_cross_entropy_forward.register_autograd(_backward, setup_context=_setup)


def linear_cross_entropy(
    h: Tensor, w: Tensor, labels: Tensor, ignore_index: int = -100, chunk_rows: int = 1024
) -> Tensor:
    """Mean cross-entropy of `h @ w.T` against `labels`, differentiable in h and w, chunked."""
    return linear_cross_entropy_forward(h, w, labels, ignore_index, chunk_rows)[0]
