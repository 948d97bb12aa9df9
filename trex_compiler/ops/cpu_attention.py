"""CPU flash attention's backward in fp32 on exact upcasts, a few heads at a time.

Why: `passes.cpu_gemm_precision` runs a bf16 (fp16) attention backward in fp32 where that is faster on the CPU
at hand (on the AMD EPYC of bench/RESULTS.md 11, fourteenth session: ~850 us native bf16 per call at tiny
Qwen3-MoE's shapes, 69 us on whole-operand upcasts, 377 us in this op's chunks). Upcasting whole operands keeps
fp32 copies of the output gradient, q, k, v and the attention output, and the fp32 gradients, alive together in
the middle of the backward: the tiny bf16 Qwen3-MoE's peak step memory rose from 1.22 to 1.32 MiB, above
Inductor's 1.27. This op upcasts, differentiates and rounds a chunk of (batch element, head) pairs at a time into
low-precision gradients allocated up front (`chunk_shape`: fp32 copies no larger than those gradients), the
pattern of the grouped GEMMs' per-expert upcasts (`ops.moe_decompositions.grouped_mm_on_group_upcasts`).
Attention is independent across batch elements and heads, so each gradient element is the fp32 kernel's value
rounded once, as in the whole-operand form.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trex.ops import moe

_library = torch.library.Library(moe.NAMESPACE, "FRAGMENT")
_library.define(
    "extern_flash_attention_backward_on_upcasts(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
    "Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, Tensor? attn_mask=None, float? scale=None) "
    "-> (Tensor, Tensor, Tensor)"
)

_ATTENTION_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def chunk_shape(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor) -> tuple[int, int]:
    """(batch elements, heads) per chunk: the most whose fp32 working copies - the five operands and the three
    gradients the fp32 kernel returns - take no more bytes than the op's own low-precision gradients, which any
    form of the op allocates; at least one head of one batch element. On tiny Qwen3-MoE (bf16, 4 x 4 heads x 32 x
    16): 3 heads of one batch element (48 KB of fp32 copies against 48 KB of bf16 gradients); a whole batch
    element's copies (64 KB) held the step's peak 768 bytes above Inductor's, 2 heads 44 KB below it."""
    batch, heads = query.shape[:2]
    tensors = (grad_out, query, key, value, out)
    per_head = 4 * (sum(t[0, 0].numel() for t in tensors) + sum(t[0, 0].numel() for t in (query, key, value)))
    budget = sum(t.numel() * t.element_size() for t in (query, key, value))
    fitting_heads = max(1, budget // max(1, per_head))
    if fitting_heads < heads:
        return 1, fitting_heads
    return max(1, min(batch, budget // (per_head * heads))), heads


def flash_attention_backward_on_upcasts(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    logsumexp: Tensor,
    dropout_p: float,
    is_causal: bool,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """`aten._scaled_dot_product_flash_attention_for_cpu_backward` computed in fp32 per batch element, its
    gradients in the operands' dtypes (module docstring)."""
    grads = (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value))
    batch, heads = query.shape[:2]
    per_batch, per_head = chunk_shape(grad_out, query, key, value, out)
    for b in range(0, batch, per_batch):
        for h in range(0, heads, per_head):
            rows = (slice(b, b + per_batch), slice(h, h + per_head))
            mask = attn_mask
            if mask is not None:
                mask = mask[b : b + per_batch] if mask.size(0) > 1 else mask
                mask = mask[:, h : h + per_head] if mask.size(1) > 1 else mask
                mask = mask.float() if mask.is_floating_point() else mask
            fp32 = _ATTENTION_BACKWARD(
                grad_out[rows].float(),
                query[rows].float(),
                key[rows].float(),
                value[rows].float(),
                out[rows].float(),
                logsumexp[rows],
                dropout_p,
                is_causal,
                attn_mask=mask,
                scale=scale,
            )
            for grad, chunk in zip(grads, fp32):
                grad[rows].copy_(chunk)
    return grads


_library.impl("extern_flash_attention_backward_on_upcasts", flash_attention_backward_on_upcasts, "CPU")


@torch.library.register_fake("trex::extern_flash_attention_backward_on_upcasts", lib=_library)
def _(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask=None, scale=None):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)
