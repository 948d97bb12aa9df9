"""The attention, gating and backward lowerings on small modules: each emits the torch_npu op it names
(forward and backward graph), the result and every gradient equal eager, and a lowering that passes an
argument torch_npu's schema does not have is caught."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import trex
from trex.backends.ascend import AscendBackend
from trex.backends.ascend.patterns import PATTERNS, FlashAttention, Match
from trex.backends.ascend.report import emitted_call_costs
from trex.backends.ascend.schemas import check_call
from trex.errors import BackendError


def _compare(model, *inputs, expect_ops):
    """Compile `model` for Ascend, run forward+backward, compare with eager; return the emitted ops."""
    reference = copy.deepcopy(model)
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    ref_leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    compiled = trex.compile(model, backend=["ascend"])
    out = compiled(*leaves)
    out.backward()
    expected = reference(*ref_leaves)
    expected.backward()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(leaves, ref_leaves):
        if a.grad is not None or b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    emitted = compiled.trex.lowered_ops().get("ascend", [])
    assert expect_ops <= set(emitted), (expect_ops - set(emitted), emitted)
    _assert_every_call_priced(compiled, len(emitted))
    return emitted


def _assert_every_call_priced(compiled, count):
    """Each emitted torch_npu call has its own cost formula and prices above 0 on ascend-910c."""
    costs = [
        pair
        for lowering in compiled.trex.graphs[0].lowerings.values()
        for child in lowering.module.children()
        if hasattr(getattr(child, "compiled", None), "module")
        for pair in emitted_call_costs(child.compiled.module.graph, "ascend-910c")
    ]
    assert len(costs) == count
    unpriced = [(op, cost.note) for op, cost in costs if not (cost.priced and cost.time_s > 0)]
    assert not unpriced, unpriced


class _Attention(torch.nn.Module):
    def __init__(self, causal: bool, heads=4, kv_heads=2, dim=8):
        super().__init__()
        self.causal, self.heads, self.kv_heads, self.dim = causal, heads, kv_heads, dim
        self.qkv = torch.nn.Linear(16, (heads + 2 * kv_heads) * dim, bias=False)

    def forward(self, x, keep=None):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.dim, self.kv_heads * self.dim, self.kv_heads * self.dim], -1)
        q = q.view(b, s, self.heads, self.dim).transpose(1, 2)
        k, v = (t.view(b, s, self.kv_heads, self.dim).transpose(1, 2) for t in (k, v))
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=self.causal, scale=0.3)
        return (out.transpose(1, 2).reshape(b, s, -1) * torch.arange(out.numel() // b // s)).sum()


@pytest.mark.parametrize("causal", [True, False], ids=["is_causal", "bool_mask"])
def test_sdpa_forward_and_backward_lower_to_npu_fusion_attention(causal):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    keep = None if causal else (torch.rand(2, 1, 6, 6) > 0.3) | torch.eye(6, dtype=torch.bool)
    inputs = (x,) if causal else (x, keep)
    emitted = _compare(_Attention(causal), *inputs, expect_ops={"npu_fusion_attention", "npu_fusion_attention_grad"})
    assert emitted.count("npu_fusion_attention") == 1 and emitted.count("npu_fusion_attention_grad") == 1


class _FlashWithGradScaleName(FlashAttention):
    """Deliberately wrong: passes the backward op's `scale_value=` to npu_fusion_attention (its name is `scale`)."""

    def match(self, node):
        good = super().match(node)
        if good is None:
            return None
        q, k, v = node.args[:3]

        def emit(e):
            fused = e.npu("npu_fusion_attention", (q, k, v, 4, "BNSD"), {"scale_value": 0.3})
            return {good.nodes[1]: e.item(fused, 0)}

        return Match(good.pattern, good.op, good.nodes, emit)


def test_a_wrong_attention_lowering_is_caught_naming_op_and_argument():
    patterns = [p for p in PATTERNS if not isinstance(p, FlashAttention)] + [_FlashWithGradScaleName()]
    compiled = trex.compile(_Attention(causal=True), backend=[AscendBackend(patterns=patterns)])
    with pytest.raises(BackendError) as raised:
        compiled(torch.randn(2, 6, 16))
    assert "npu_fusion_attention" in str(raised.value) and "'scale_value'" in str(raised.value)


class _Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(16) + 0.5)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.proj(x)
        normed = self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))
        return (normed * torch.linspace(-1, 1, 16)).sum()


def test_rms_norm_backward_graph_uses_npu_rms_norm_backward():
    emitted = _compare(_Norm(), torch.randn(3, 5, 16), expect_ops={"npu_rms_norm", "npu_rms_norm_backward"})
    assert emitted == ["npu_rms_norm", "npu_rms_norm_backward"]


class _ClampedExperts(torch.nn.Module):
    """Routed experts with DeepSeek-V4's clamped SwiGLU, through trex's fused experts op (as trex.compile
    routes transformers' experts): canonicalization writes its backward, the region the lowering matches."""

    def __init__(self, experts=4, hidden=8, inner=8, limit=0.5):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.randn(experts, 2 * inner, hidden))
        self.down_proj = torch.nn.Parameter(torch.randn(experts, hidden, inner) * 0.3)
        self.limit = limit

    def forward(self, x, index, weights):
        import trex.ops.moe  # noqa: F401 - registers torch.ops.trex

        out = torch.ops.trex.moe_experts(
            x, index, weights, self.gate_up_proj, self.down_proj, "silu", self.limit, False
        )
        return (out[0] * torch.linspace(-1, 1, x.size(-1))).sum()


def test_clamped_swiglu_backward_lowers_to_npu_swiglu_backward_and_the_clamp_mask():
    torch.manual_seed(0)
    index = torch.stack([torch.randperm(4)[:2] for _ in range(10)])
    ops = {"npu_clipped_swiglu", "npu_swiglu_backward", "npu_grouped_matmul", "npu_moe_init_routing_v2"}
    _compare(_ClampedExperts(), torch.randn(10, 8), index, torch.rand(10, 2), expect_ops=ops)


def _lowered_modules(compiled):
    return [
        child.compiled.module
        for graph in compiled.trex.graphs
        for lowering in graph.lowerings.values()
        for child in lowering.module.children()
        if hasattr(getattr(child, "compiled", None), "module")
    ]


def test_dispatch_lowers_to_init_routing_v2_whose_counts_feed_the_grouped_gemms():
    """trex.moe_dispatch -> one npu_moe_init_routing_v2 (bound against the wheel's schema, row_idx_type 1, count
    mode); the forward grouped GEMMs take its counts as group_list (group_list_type 1): no index_select, no
    npu_moe_compute_expert_tokens, no int64 cast of the group ends in the forward."""
    torch.manual_seed(0)
    index = torch.stack([torch.randperm(4)[:2] for _ in range(10)])
    ops = {"npu_moe_init_routing_v2", "npu_grouped_matmul", "npu_moe_token_unpermute"}
    model = _ClampedExperts()
    emitted = _compare(model, torch.randn(10, 8), index, torch.rand(10, 2), expect_ops=ops)
    assert "npu_moe_token_permute" not in emitted and "npu_moe_compute_expert_tokens" not in emitted
    compiled = trex.compile(copy.deepcopy(model), backend=["ascend"])
    compiled(torch.randn(10, 8), index, torch.rand(10, 2)).backward()
    modules = _lowered_modules(compiled)
    routing = [n for gm in modules for n in gm.graph.nodes if n.meta.get("trex_npu_op") == "npu_moe_init_routing_v2"]
    assert len(routing) == 1
    bound = check_call("npu_moe_init_routing_v2", routing[0].args, routing[0].kwargs)
    assert bound.arguments["row_idx_type"] == 1 and bound.arguments["expert_tokens_num_type"] == 1
    counts = [u for u in routing[0].users if u.args[1] == 2]
    forward_gemms = [u for c in counts for u in c.users if u.meta.get("trex_npu_op") == "npu_grouped_matmul"]
    assert len(forward_gemms) == 2  # gate_up and down
    assert all(g.kwargs["group_list_type"] == 1 and g.kwargs["group_type"] == 0 for g in forward_gemms)
    forward = routing[0].graph
    assert not [n for n in forward.nodes if n.target is torch.ops.aten.index_select.default]


def test_the_share_prices_each_fused_call_by_its_own_formula():
    """The summary's share: fused calls priced by their own formulas (the cost model's torch_npu formulas), over
    the lowered graph (nodes left + fused calls + glue); the earlier accounting (calls priced as the nodes they
    replaced) is kept apart and, on this launch-bound toy, flatters the fused ops."""
    from trex.backends.ascend.report import shares

    torch.manual_seed(0)
    index = torch.stack([torch.randperm(4)[:2] for _ in range(10)])
    backend = AscendBackend()
    compiled = trex.compile(_ClampedExperts(), backend=[backend])
    compiled(torch.randn(10, 8), index, torch.rand(10, 2)).backward()
    reports = [r for r in backend.reports if r.total_s > 0]
    own = sum(
        cost.time_s for gm in _lowered_modules(compiled) for _, cost in emitted_call_costs(gm.graph, "ascend-910c")
    )
    assert sum(r.fused_s for r in reports) == pytest.approx(own, rel=1e-9)
    for r in reports:
        assert r.lowered_s == pytest.approx(r.total_s - r.removed_s + r.emitted_s + r.glue_s)
        assert r.moe_share == pytest.approx(r.moe_fused_s / r.moe_lowered_s)
    got = shares(reports)
    assert 0 < got["moe"] < got["moe_replaced"] <= 1
    line = compiled.trex.summary()
    assert "priced by its own formula" in line and f"MoE layers: {100 * got['moe']:.1f}%" in line


class _GroupLimitedRouter(torch.nn.Module):
    """DeepSeek-V3's noaux_tc routing (sigmoid scores, e_score_correction_bias for the choice only,
    top-2-sum group scores, k_group groups kept, normalised weights times routed_scaling_factor)."""

    def __init__(self, experts=8, groups=2, k_group=1, top_k=2, scaling=2.5):
        super().__init__()
        self.gate = torch.nn.Linear(16, experts, bias=False)
        self.register_buffer("bias", torch.linspace(-0.1, 0.1, experts))
        self.experts, self.groups, self.k_group, self.top_k, self.scaling = experts, groups, k_group, top_k, scaling

    def forward(self, x):
        scores = self.gate(x).sigmoid()
        choice = scores + self.bias
        group_scores = choice.view(-1, self.groups, self.experts // self.groups).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=self.k_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, self.groups, self.experts // self.groups).reshape(-1, 8)
        choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
        index = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, index)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * self.scaling
        routed = torch.zeros_like(scores).scatter(1, index, weights)  # order-free use of (index, weight)
        return (routed * torch.linspace(-1, 1, 8)).sum()


def test_v3_group_limited_gating_lowers_to_npu_moe_gating_top_k_and_its_backward():
    torch.manual_seed(0)
    _compare(
        _GroupLimitedRouter(),
        torch.randn(10, 16),
        expect_ops={"npu_moe_gating_top_k", "npu_moe_gating_top_k_backward"},
    )


class _Rope(torch.nn.Module):
    """Rotate-half RoPE on 4-D heads (as transformers' apply_rotary_pos_emb): the forward -> npu_rotary_mul,
    the gradient w.r.t. the heads -> npu_rotary_mul_backward."""

    def __init__(self, heads=2, dim=8, seq=6):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.proj = torch.nn.Linear(16, heads * dim)
        angles = torch.arange(seq)[:, None] * (0.5 ** torch.arange(dim // 2))[None]
        angles = torch.cat([angles, angles], -1)[None, None]
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    def forward(self, x):
        b, s, _ = x.shape
        q = self.proj(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        rotated = torch.cat([-q[..., self.dim // 2 :], q[..., : self.dim // 2]], dim=-1)
        out = q * self.cos + rotated * self.sin
        return (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum()


def test_rotary_forward_and_backward_lower_to_npu_rotary_mul_and_its_backward():
    torch.manual_seed(0)
    emitted = _compare(_Rope(), torch.randn(2, 6, 16), expect_ops={"npu_rotary_mul", "npu_rotary_mul_backward"})
    assert emitted.count("npu_rotary_mul_backward") == 1


class _InterleavedRope(torch.nn.Module):
    """The two interleaved RoPE forms of the DeepSeek models, on the last `rope` lanes of 4-D heads:
    "v4": x * cos + stack([-x[..., 1::2], x[..., 0::2]], -1) viewed back * sin, tables repeated per lane
    pair (DeepSeek-V4, partial RoPE); "v3": cat([xe * c - xo * s, xo * c + xe * s], -1) with half-size
    tables (transformers' DeepSeek-V3). Both -> npu_rotary_mul(rotary_mode="interleave")."""

    def __init__(self, form, heads=2, dim=12, rope=8, seq=6, dtype=torch.float32):
        super().__init__()
        self.form, self.heads, self.dim, self.rope = form, heads, dim, rope
        self.proj = torch.nn.Linear(16, heads * dim, dtype=dtype)
        angles = torch.arange(seq)[:, None] * (0.5 ** torch.arange(rope // 2))[None]
        if form.startswith("v4"):
            angles = angles.repeat_interleave(2, -1)
        self.register_buffer("cos", angles.cos()[None, None].to(dtype))
        self.register_buffer("sin", angles.sin()[None, None].to(dtype))

    def forward(self, x):
        b, s, _ = x.shape
        q = self.proj(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        plain, x = q[..., : -self.rope], q[..., -self.rope :]
        if self.form == "v4":
            rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).view(x.shape)
            roped = x * self.cos + rotated * self.sin
        elif self.form == "v4-fp32-arms":  # transformers' V4 in bf16: both arms in fp32, tables in the model's dtype
            rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
            roped = ((x.float() * self.cos) + (rotated.float() * self.sin)).to(x.dtype)
        else:
            even, odd = x[..., 0::2], x[..., 1::2]
            roped = torch.cat([even * self.cos - odd * self.sin, odd * self.cos + even * self.sin], -1)
        out = torch.cat([plain, roped], -1)
        return (out.float() * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum()


def _rotary_calls(compiled):
    graph = compiled.trex.graphs[0]
    return [
        node
        for lowering in graph.lowerings.values()
        for child in lowering.module.children()
        if hasattr(getattr(child, "compiled", None), "module")
        for node in child.compiled.module.graph.nodes
        if node.meta.get("trex_npu_op") == "npu_rotary_mul"
    ]


@pytest.mark.parametrize("form", ["v4", "v3"])
def test_deepseek_interleaved_rope_forms_lower_to_npu_rotary_mul_interleave(form):
    torch.manual_seed(0)
    model = _InterleavedRope(form)
    # both forms are rewritten before AOTAutograd, so the backward is the op's own npu_rotary_mul_backward
    backward = {"npu_rotary_mul_backward"}
    emitted = _compare(model, torch.randn(2, 6, 16), expect_ops={"npu_rotary_mul"} | backward)
    assert emitted.count("npu_rotary_mul") == 1 and emitted.count("npu_rotary_mul_backward") == len(backward)
    compiled = trex.compile(_InterleavedRope(form), backend=["ascend"])
    compiled(torch.randn(2, 6, 16)).backward()
    (call,) = _rotary_calls(compiled)
    bound = check_call("npu_rotary_mul", call.args, call.kwargs)  # torch_npu's schema, from the wheel
    assert bound.arguments["rotary_mode"] == "interleave"
    x, r1, r2 = (bound.arguments[name].meta["val"] for name in ("self", "r1", "r2"))
    assert x.shape[-1] == r1.shape[-1] == r2.shape[-1] == 8 and tuple(r1.shape[:2]) == (1, 1)  # 11SD tables


@pytest.mark.slow
@pytest.mark.parametrize("form", ["v4", "v3"])
def test_deepseek_interleaved_rope_forms_in_bf16_match_eager(form):
    torch.manual_seed(0)
    model = _InterleavedRope(form, dtype=torch.bfloat16)
    reference = copy.deepcopy(model)
    x = torch.randn(2, 6, 16, dtype=torch.bfloat16)
    compiled = trex.compile(model, backend=["ascend"])
    out, expected = compiled(x), reference(x)
    out.backward()
    expected.backward()
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=2e-2, msg=lambda m, n=name: f"{n}: {m}")
    assert "npu_rotary_mul" in compiled.trex.lowered_ops()["ascend"]


def test_v4_bf16_rope_with_fp32_arms_lowers_forward_and_backward_before_autograd():
    """transformers' DeepSeek-V4 RoPE in bf16 multiplies x.float() by bf16 tables (promoted to fp32, exactly): the
    tables are cast to fp32 for npu_rotary_mul (one dtype), so the backward is npu_rotary_mul_backward too."""
    torch.manual_seed(0)
    model = _InterleavedRope("v4-fp32-arms", dtype=torch.bfloat16)
    reference = copy.deepcopy(model)
    x = torch.randn(2, 6, 16, dtype=torch.bfloat16)
    compiled = trex.compile(model, backend=["ascend"])
    out, expected = compiled(x), reference(x)
    out.backward()
    expected.backward()
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=2e-2, msg=lambda m, n=name: f"{n}: {m}")
    emitted = compiled.trex.lowered_ops()["ascend"]
    assert emitted.count("npu_rotary_mul") == 1 and emitted.count("npu_rotary_mul_backward") == 1, emitted
    (call,) = _rotary_calls(compiled)
    bound = check_call("npu_rotary_mul", call.args, call.kwargs)
    assert {bound.arguments[n].meta["val"].dtype for n in ("self", "r1", "r2")} == {torch.float32}
    _assert_every_call_priced(compiled, len(emitted))


def test_interleaved_rope_with_tables_of_the_wrong_width_is_not_lowered():
    """A rotation whose tables do not cover the rotated lanes is not torch_npu's formula: left to eager."""
    torch.manual_seed(0)
    model = _InterleavedRope("v4")
    model.cos, model.sin = model.cos[..., :1], model.sin[..., :1]  # broadcast over the lanes: not r1's layout
    compiled = trex.compile(model, backend=["ascend"])
    compiled(torch.randn(2, 6, 16)).backward()
    assert "npu_rotary_mul" not in compiled.trex.lowered_ops().get("ascend", [])


class _SinkAttention(torch.nn.Module):
    """DeepSeek-V4's eager attention in small: one shared key/value head repeated (repeat_kv), an additive
    mask `where(keep, 0, finfo.min)` concatenated with a compressor-style block mask (new_full(-inf) then
    scatter_ of 0), per-head sinks appended to the logits, the max subtracted, the sink column dropped."""

    def __init__(self, bias_mask=False, heads=4, dim=8):
        super().__init__()
        self.heads, self.dim, self.bias_mask = heads, dim, bias_mask
        self.q = torch.nn.Linear(16, heads * dim, bias=False)
        self.kv = torch.nn.Linear(16, dim, bias=False)
        self.sinks = torch.nn.Parameter(torch.randn(heads))

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        kv = self.kv(x).view(b, s, 1, self.dim).transpose(1, 2)
        keep = torch.ones(s, s, dtype=torch.bool).tril()[None, None].expand(b, -1, -1, -1)
        mask = torch.where(keep, torch.zeros((), dtype=torch.float32), torch.finfo(torch.float32).min)
        if self.bias_mask:  # a finite position bias: torch_npu has no float-mask argument for it
            mask = mask + torch.linspace(-1, 0, s)
        block = kv.new_full((b, 1, s, 3), float("-inf"))
        block.scatter_(-1, (torch.arange(s) % 3).view(1, 1, s, 1).expand(b, 1, s, 1), 0.0)
        mask = torch.cat([mask, block.to(torch.float32)], -1)
        kv = torch.cat([kv, kv[:, :, :3]], 2)
        k = kv[:, :, None, :, :].expand(b, 1, self.heads, s + 3, self.dim).reshape(b, self.heads, s + 3, self.dim)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.dim**-0.5 + mask
        logits = torch.cat([scores, self.sinks.reshape(1, -1, 1, 1).expand(b, -1, s, -1)], -1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = F.dropout(F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1], p=0.0, training=True)
        out = torch.matmul(probs.to(k.dtype), k).transpose(1, 2).reshape(b, s, -1)
        return (out * torch.arange(out.size(-1))).sum()


class _MlaSdpa(torch.nn.Module):
    """DeepSeek-V3's MLA shape in small: SDPA with Dq = Dk = 12 > Dv = 8 (SDPA's math path on CPU)."""

    def __init__(self, causal):
        super().__init__()
        self.causal = causal
        self.qk = torch.nn.Linear(16, 2 * 4 * 12, bias=False)
        self.v = torch.nn.Linear(16, 4 * 8, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k = (t.view(b, s, 4, 12).transpose(1, 2) for t in self.qk(x).chunk(2, -1))
        v = self.v(x).view(b, s, 4, 8).transpose(1, 2)
        keep = None if self.causal else torch.ones(s, s, dtype=torch.bool).tril()[None, None].expand(b, 1, s, s)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=self.causal, scale=0.3)
        return (out.transpose(1, 2).reshape(b, s, -1) * torch.arange(32)).sum()


def _attention_calls(compiled):
    """The npu_fusion_attention(_grad) calls of the lowered graphs, each re-bound against the wheel's schema."""
    calls = []
    for lowering in compiled.trex.graphs[0].lowerings.values():
        for child in lowering.module.children():
            module = getattr(getattr(child, "compiled", None), "module", None)
            for node in module.graph.nodes if module is not None else ():
                if node.meta.get("trex_npu_op", "").startswith("npu_fusion_attention"):
                    check_call(node.meta["trex_npu_op"], node.args, node.kwargs)
                    calls.append(node)
    return calls


def test_deepseek_v4_eager_attention_with_sinks_lowers_before_autograd():
    """The forward becomes one npu_fusion_attention (sink, the un-repeated single key/value head, the proven
    0/-inf mask as a bool atten_mask) and the backward the op's own npu_fusion_attention_grad: output and
    every gradient (the sinks' too) equal eager."""
    torch.manual_seed(0)
    emitted = _compare(
        _SinkAttention(), torch.randn(2, 6, 16), expect_ops={"npu_fusion_attention", "npu_fusion_attention_grad"}
    )
    assert emitted.count("npu_fusion_attention") == 1 and emitted.count("npu_fusion_attention_grad") == 1


def test_deepseek_v4_attention_call_arguments_bind_to_the_schema():
    torch.manual_seed(0)
    compiled = trex.compile(_SinkAttention(), backend=["ascend"])
    compiled(torch.randn(2, 6, 16)).backward()
    forward, backward = sorted(_attention_calls(compiled), key=lambda n: n.meta["trex_npu_op"])
    k = forward.args[1].meta["val"]
    assert forward.args[3:5] == (4, "BNSD") and k.size(1) == 1  # GQA: the shared head, not its 4 copies
    assert forward.args[7].meta["val"].dtype == torch.bool  # atten_mask
    assert forward.args[20] is not None and backward.kwargs["sink"] is not None  # sink


def test_an_attention_with_a_finite_additive_bias_is_left_to_eager():
    """A mask holding finite non-zero values cannot become a bool atten_mask: not lowered, still equal."""
    torch.manual_seed(0)
    emitted = _compare(_SinkAttention(bias_mask=True), torch.randn(2, 6, 16), expect_ops=set())
    assert "npu_fusion_attention" not in emitted


@pytest.mark.parametrize("causal", [True, False], ids=["is_causal", "bool_mask"])
def test_deepseek_v3_mla_sdpa_with_dq_above_dv_lowers_before_autograd(causal):
    torch.manual_seed(0)
    _compare(_MlaSdpa(causal), torch.randn(2, 6, 16), expect_ops={"npu_fusion_attention", "npu_fusion_attention_grad"})


def test_a_wrong_attention_lowering_before_autograd_is_caught(monkeypatch):
    """Deliberately wrong: the rewrite passes the backward op's `scale_value=` to npu_fusion_attention."""
    from trex.backends.ascend import attention_before_autograd as before

    right = before.call_arguments

    def wrong(*args):
        positional, kwargs = right(*args)
        kwargs["scale_value"] = kwargs.pop("scale")
        return positional, kwargs

    monkeypatch.setattr(before, "call_arguments", wrong)
    compiled = trex.compile(_SinkAttention(), backend=["ascend"])
    with pytest.raises(Exception) as raised:
        compiled(torch.randn(2, 6, 16))
    assert "npu_fusion_attention" in str(raised.value) and "'scale_value'" in str(raised.value)
