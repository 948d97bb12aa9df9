"""The CPU emulations of torch_npu ops compute what trex's own ops (and plain torch) compute, forward and backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import trex.ops  # noqa: F401
from trex.backends.ascend import emulation  # noqa: F401 - registers torch.ops.npu_emul

npu = torch.ops.npu_emul
trex_ops = torch.ops.trex


def _routing(tokens=6, experts=4, top_k=2, hidden=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden_states = torch.randn(tokens, hidden, generator=g)
    index = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=g)
    return hidden_states, index, weights


def test_token_permute_and_compute_expert_tokens_equal_trex_dispatch():
    hidden, index, _ = _routing()
    sorted_hidden, perm, offsets = trex_ops.moe_dispatch(hidden, index, 4)
    permuted, sorted_indices = npu.npu_moe_token_permute(hidden, index)
    assert sorted_indices.dtype == torch.int32
    torch.testing.assert_close(permuted, sorted_hidden)
    assert torch.equal(sorted_indices.long(), perm)
    ends = npu.npu_moe_compute_expert_tokens(index.reshape(-1)[perm].int(), 4)
    assert torch.equal(ends, offsets)


def test_token_unpermute_and_its_grad_equal_trex_combine():
    hidden, index, weights = _routing()
    _, perm, _ = trex_ops.moe_dispatch(hidden, index, 4)
    expert_out = torch.randn(perm.numel(), 8, requires_grad=True)
    probs = weights.clone().requires_grad_()
    out = npu.npu_moe_token_unpermute(expert_out, perm, probs)
    expected = trex_ops.moe_combine(expert_out, perm, probs)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (expert_out, probs), grad)
    want = torch.autograd.grad(expected, (expert_out, probs), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_grouped_matmul_and_grouped_matmul_add_equal_trex_grouped_mm():
    hidden, index, _ = _routing()
    sorted_hidden, _, offsets = trex_ops.moe_dispatch(hidden, index, 4)
    weight = torch.randn(4, 8, 12)
    (out,) = npu.npu_grouped_matmul(
        [sorted_hidden], [weight], group_list=offsets.long(), split_item=3, group_type=0, group_list_type=0
    )
    torch.testing.assert_close(out, trex_ops.grouped_mm(sorted_hidden, weight, offsets))
    counts = torch.diff(offsets.long(), prepend=torch.zeros(1, dtype=torch.long))
    (by_count,) = npu.npu_grouped_matmul(
        [sorted_hidden], [weight], group_list=counts, split_item=3, group_type=0, group_list_type=1
    )
    torch.testing.assert_close(by_count, out)
    b = torch.randn(sorted_hidden.size(0), 12)
    summed = npu.npu_grouped_matmul_add(torch.zeros(4, 8, 12), sorted_hidden, b, offsets.long())
    torch.testing.assert_close(summed, trex_ops.grouped_mm_weight_grad(sorted_hidden, b, offsets))


def test_rms_norm_swiglu_rotary_forward_and_backward_equal_torch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 8, generator=g, requires_grad=True)
    w = torch.randn(8, generator=g, requires_grad=True)
    y, rstd = npu.npu_rms_norm(x, w, 1e-6)
    expected = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(y, expected)
    grad = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, (x, w), grad), torch.autograd.grad(expected, (x, w), grad)):
        torch.testing.assert_close(a, b)

    z = torch.randn(4, 10, generator=g, requires_grad=True)
    out = npu.npu_swiglu(z, -1)
    gate, up = z.chunk(2, -1)
    ref = F.silu(gate) * up
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, z, grad)[0], torch.autograd.grad(ref, z, grad)[0])

    q = torch.randn(2, 3, 5, 8, generator=g, requires_grad=True)
    cos = torch.randn(2, 1, 5, 8, generator=g, requires_grad=True)
    sin = torch.randn(2, 1, 5, 8, generator=g, requires_grad=True)
    out = npu.npu_rotary_mul(q, cos, sin, "half")
    ref = q * cos + torch.cat([-q[..., 4:], q[..., :4]], -1) * sin
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, cos, sin), grad), torch.autograd.grad(ref, (q, cos, sin), grad)):
        torch.testing.assert_close(a, b)


def test_gating_top_k_softmax_equals_softmax_then_topk():
    logits = torch.randn(5, 6)
    y, expert_idx, row_idx = npu.npu_moe_gating_top_k_softmax(logits, None, 2)
    values, indices = torch.topk(torch.softmax(logits, -1), 2)
    torch.testing.assert_close(y, values)
    assert torch.equal(expert_idx.long(), indices) and expert_idx.dtype == torch.int32
    assert row_idx[3, 1].item() == 1 * 5 + 3  # row_idx[i, j] = j * rows + i


def test_grouped_matmul_emulation_handles_widths_torch_grouped_mm_rejects():
    hidden, index, _ = _routing()
    sorted_hidden, _, offsets = trex_ops.moe_dispatch(hidden, index, 4)
    weight = torch.randn(4, 8, 5)  # 5 fp32 columns: not a 16-byte stride
    (out,) = npu.npu_grouped_matmul(
        [sorted_hidden], [weight], group_list=offsets.long(), split_item=3, group_type=0, group_list_type=0
    )
    start = 0
    for expert, end in enumerate(offsets.tolist()):
        torch.testing.assert_close(out[start:end], sorted_hidden[start:end] @ weight[expert])
        start = end


def test_clipped_swiglu_with_alpha_1_bias_0_is_deepseek_v4_clamped_swiglu():
    x = torch.randn(3, 8, requires_grad=True)
    out = npu.npu_clipped_swiglu(x, dim=-1, alpha=1.0, limit=0.5, bias=0.0, interleaved=False)
    gate, up = x.chunk(2, -1)
    ref = F.silu(gate.clamp(max=0.5)) * up.clamp(-0.5, 0.5)
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, x, grad)[0], torch.autograd.grad(ref, x, grad)[0])
