"""The CPU emulations of torch_npu ops compute what trex's own ops (and plain torch) compute, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import trex.ops  # noqa: F401
from trex.backends.ascend import emulation  # noqa: F401 - registers torch.ops.npu_emul
from trex.backends.ascend.schemas import AscendSchemaError

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


@pytest.mark.parametrize("active", [-1, 12], ids=["all_rows", "active_num"])
def test_init_routing_v2_equals_trex_dispatch(active):
    """npu_moe_init_routing_v2 (count mode, row_idx_type 1) gives trex.moe_dispatch's sorted rows, its perm
    (expanded_row_idx) and the per-expert counts whose running sum is trex's group ends; row_idx_type 0 gives the
    inverse map (the expanded row of each source pair)."""
    hidden, index, _ = _routing(tokens=6, experts=5, top_k=2)
    sorted_hidden, perm, offsets = trex_ops.moe_dispatch(hidden, index, 5)
    common = {
        "active_num": active,
        "expert_num": 5,
        "expert_tokens_num_type": 1,
        "expert_tokens_num_flag": True,
        "active_expert_range": [0, 5],
    }
    expanded, row_idx, counts, _ = npu.npu_moe_init_routing_v2(hidden, index.int(), row_idx_type=1, **common)
    assert row_idx.dtype == torch.int32 and counts.dtype == torch.int64 and counts.shape == (5,)
    torch.testing.assert_close(expanded, sorted_hidden)
    assert torch.equal(row_idx.long(), perm)
    assert torch.equal(torch.cumsum(counts, 0).int(), offsets)
    _, inverse, _, _ = npu.npu_moe_init_routing_v2(hidden, index.int(), row_idx_type=0, **common)
    assert torch.equal(inverse.long()[perm], torch.arange(perm.numel()))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"expert_tokens_num_type": 0}, "expert_tokens_num_type"),  # cumsum: not supported by the op (its docs)
        ({"quant_mode": 1}, "unquantised"),
        ({"active_expert_range": [1, 4]}, "active_expert_range"),
        ({"drop_pad_mode": 1}, "drop_pad_mode"),
    ],
)
def test_init_routing_v2_refuses_modes_it_does_not_emulate(kwargs, named):
    hidden, index, _ = _routing(experts=4)
    arguments = {"expert_num": 4, "expert_tokens_num_type": 1, "expert_tokens_num_flag": True, **kwargs}
    with pytest.raises(AscendSchemaError, match=named):
        npu.npu_moe_init_routing_v2(hidden, index.int(), **arguments)
    with pytest.raises(AscendSchemaError, match="int32"):
        npu.npu_moe_init_routing_v2(hidden, index, expert_num=4, expert_tokens_num_type=1, expert_tokens_num_flag=True)


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


def _attention_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 10, 8, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 10, 8, generator=g, requires_grad=True)  # GQA: 2 key/value heads for 4 query heads
    v = torch.randn(2, 2, 10, 8, generator=g, requires_grad=True)
    return q, k, v


def _sdpa(q, k, v, keep):
    return F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), keep, scale=0.3)


def test_fusion_attention_and_its_grad_equal_sdpa_with_an_explicit_mask():
    q, k, v = _attention_inputs()
    keep = (torch.rand(2, 1, 10, 10, generator=torch.Generator().manual_seed(3)) > 0.4) | torch.eye(
        10, dtype=torch.bool
    )
    out, softmax_max, softmax_sum, _, *_ = npu.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=~keep, scale=0.3)
    assert softmax_max.shape == softmax_sum.shape == (2, 4, 10, 8) and softmax_max.dtype == torch.float32
    expected = _sdpa(q, k, v, keep)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), want):
        torch.testing.assert_close(a, b)
    # the backward op fed logsumexp as softmax_max and ones as softmax_sum gives the same gradients
    lse = (softmax_max + softmax_sum.log())[..., :1].expand(2, 4, 10, 8)
    grads = npu.npu_fusion_attention_grad(
        q,
        k,
        v,
        grad,
        4,
        "BNSD",
        atten_mask=~keep,
        softmax_max=lse,
        softmax_sum=torch.ones_like(lse),
        attention_in=out,
        scale_value=0.3,
    )
    for a, b in zip(grads[:3], want):
        torch.testing.assert_close(a, b)


def test_fusion_attention_sparse_modes_give_causal_and_band_masks():
    q, k, v = _attention_inputs(1)
    compressed = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    i = torch.arange(10)
    causal = i[None, :] <= i[:, None]
    for mode in (2, 3):  # square: top-left and bottom-right causal coincide
        out = npu.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=compressed, scale=0.3, sparse_mode=mode)[0]
        torch.testing.assert_close(out, _sdpa(q, k, v, causal))
    band = causal & (i[None, :] > i[:, None] - 4)  # a sliding window of 4 keys
    out = npu.npu_fusion_attention(
        q, k, v, 4, "BNSD", atten_mask=compressed, scale=0.3, sparse_mode=4, pre_tockens=3, next_tockens=0
    )[0]
    torch.testing.assert_close(out, _sdpa(q, k, v, band))
    bsnd = npu.npu_fusion_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), 4, "BSND", atten_mask=compressed, scale=0.3, sparse_mode=2
    )[0]
    torch.testing.assert_close(bsnd.transpose(1, 2), _sdpa(q, k, v, causal))


def test_moe_gating_top_k_equals_deepseek_v3_group_limited_routing_forward_and_backward():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(12, 8, generator=g, requires_grad=True)
    bias = torch.randn(8, generator=g) * 0.1
    y, index, norm = npu.npu_moe_gating_top_k(
        x,
        2,
        bias=bias,
        k_group=1,
        group_count=2,
        group_select_mode=1,
        norm_type=1,
        out_flag=True,
        routed_scaling_factor=2.5,
    )
    scores = x.sigmoid()
    choice = scores + bias
    groups = choice.view(12, 2, 4).topk(2, -1)[0].sum(-1).topk(1, -1)[1]
    kept = torch.zeros(12, 2).scatter(1, groups, 1).unsqueeze(-1).expand(12, 2, 4).reshape(12, 8).bool()
    expected_index = choice.masked_fill(~kept, float("-inf")).topk(2, -1)[1]
    weights = scores.gather(1, expected_index)
    weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * 2.5
    assert index.dtype == torch.int32 and torch.equal(index.long(), expected_index)
    torch.testing.assert_close(y, weights)
    torch.testing.assert_close(norm, scores.detach())
    grad = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, x, grad)[0], torch.autograd.grad(weights, x, grad)[0])


def test_fusion_attention_with_a_sink_equals_the_docs_reference_forward_and_backward():
    """torch_npu's documented reference for `sink`: one logit per head appended to every row before the
    softmax and dropped before @ v; GQA (one key/value head), Dq 8 > Dv 5, a bool mask; the gradient of
    the sink comes back as the backward op's fifth output (through the op's autograd)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 6, 8, generator=g, requires_grad=True)
    k = torch.randn(2, 1, 9, 8, generator=g, requires_grad=True)
    v = torch.randn(2, 1, 9, 5, generator=g, requires_grad=True)
    sink = torch.randn(4, generator=g, requires_grad=True)
    keep = torch.rand(2, 1, 6, 9, generator=g) > 0.3
    keep[..., 0] = True
    out = npu.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=~keep, scale=0.3, sink=sink)[0]
    scores = (q @ k.expand(2, 4, 9, 8).transpose(-1, -2)) * 0.3 + torch.where(keep, 0.0, float("-inf"))
    logits = torch.cat([scores, sink.view(1, 4, 1, 1).expand(2, 4, 6, 1)], -1)
    expected = torch.softmax(logits, -1)[..., :-1] @ v.expand(2, 4, 9, 5)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    for a, b in zip(
        torch.autograd.grad(out, (q, k, v, sink), grad), torch.autograd.grad(expected, (q, k, v, sink), grad)
    ):
        torch.testing.assert_close(a, b)
    with pytest.raises(AscendSchemaError, match="'sink'"):  # torch_npu's sink is [head_num] float32
        npu.npu_fusion_attention(q, k, v, 4, "BNSD", sink=sink.double())
