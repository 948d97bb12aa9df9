"""trex.extern_flash_attention_backward_on_upcasts: CPU flash attention's backward in fp32, a few heads at a time."""

from __future__ import annotations

import pytest
import torch

from trex.ops.cpu_attention import chunk_shape

BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
EXTERN = torch.ops.trex.extern_flash_attention_backward_on_upcasts.default


def _operands(batch, heads, mask_batch, dtype=torch.bfloat16):
    torch.manual_seed(0)
    q = torch.randn(batch, heads, 32, 16, dtype=dtype)
    kv = torch.randn(batch, heads // 2, 1, 32, 16, dtype=dtype)  # GQA: two query heads per key head
    k = kv.expand(batch, heads // 2, 2, 32, 16).reshape(batch, heads, 32, 16)
    v = (kv * 0.5).expand(batch, heads // 2, 2, 32, 16).reshape(batch, heads, 32, 16)
    mask = None
    if mask_batch:
        causal = torch.ones(32, 32, dtype=torch.bool).triu(1)
        mask = torch.zeros(mask_batch, 1, 32, 32, dtype=dtype).masked_fill(causal, float("-inf"))
    out, lse = FORWARD(q, k, v, 0.0, mask is None, attn_mask=mask, scale=0.25)
    grad = torch.randn_like(out)
    return grad, q, k, v, out, lse, mask


@pytest.mark.parametrize("mask_batch", [0, 1, 4], ids=["causal", "mask_broadcast", "mask_per_batch"])
def test_the_chunked_fp32_backward_equals_the_whole_operand_fp32_backward_rounded_once(mask_batch):
    grad, q, k, v, out, lse, mask = _operands(4, 4, mask_batch)
    causal = mask is None
    chunked = EXTERN(grad, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=0.25)
    whole = BACKWARD(
        grad.float(),
        q.float(),
        k.float(),
        v.float(),
        out.float(),
        lse,
        0.0,
        causal,
        attn_mask=None if mask is None else mask.float(),
        scale=0.25,
    )
    for c, w, x in zip(chunked, whole, (q, k, v)):
        assert c.dtype == x.dtype and c.shape == x.shape
        torch.testing.assert_close(c.float(), w.to(x.dtype).float(), rtol=0, atol=0)
    native = BACKWARD(grad, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=0.25)
    for c, n in zip(chunked, native):  # and within bf16 rounding of the native bf16 kernel
        torch.testing.assert_close(c, n, rtol=2e-2, atol=2e-2)


def test_the_fake_kernel_gives_the_real_kernel_s_layouts():
    from torch._subclasses.fake_tensor import FakeTensorMode

    grad, q, k, v, out, lse, mask = _operands(2, 4, 1)
    real = EXTERN(grad, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=0.25)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fakes = [mode.from_tensor(t) for t in (grad, q, k, v, out, lse, mask)]
        fake = EXTERN(*fakes[:6], 0.0, False, attn_mask=fakes[6], scale=0.25)
    assert [(t.shape, t.stride(), t.dtype) for t in fake] == [(t.shape, t.stride(), t.dtype) for t in real]


def test_a_chunk_s_fp32_copies_take_no_more_bytes_than_the_op_s_own_gradients():
    t = torch.empty(4, 4, 32, 16, dtype=torch.bfloat16)
    assert chunk_shape(t, t, t, t, t) == (1, 3)  # 3 heads: 48 KB of fp32 copies, 48 KB of bf16 gradients
    small = torch.empty(8, 2, 4, 4, dtype=torch.bfloat16)
    batch, heads = chunk_shape(small, small, small, small, small)
    assert heads == 2 and batch >= 1
    assert 4 * 8 * batch * heads * 16 <= 3 * small.numel() * 2
