"""The Triton pattern pass rewrites RMSNorm and SwiGLU forwards to trex's kernels (when asked or on
a GPU target) and training gives the eager loss and gradients, with the rewrite on and off."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

import trex
from trex.backends.triton.availability import kernels_run_on, triton_import_error
from trex.passes import TritonPatterns


class NormSwiGLU(torch.nn.Module):
    """transformers' RMSNorm (fp32 statistics) feeding a SwiGLU MLP, twice."""

    def __init__(self, hidden=24):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(1 + 0.1 * torch.randn(hidden)) for _ in range(2))
        self.up = torch.nn.ModuleList(torch.nn.Linear(hidden, 2 * hidden, bias=False) for _ in range(2))
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, x):
        for weight, up in zip(self.weights, self.up):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            gate, value = up(weight * h.to(x.dtype)).chunk(2, dim=-1)
            x = x + torch.nn.functional.silu(gate) * value
        return self.head(x).sum()


@pytest.mark.parametrize("rewrite", [True, False], ids=["kernels-on", "kernels-off"])
def test_training_matches_eager_with_the_kernels_on_and_off(rewrite):
    torch.manual_seed(0)
    model, x = NormSwiGLU(), torch.randn(6, 24)
    reference = copy.deepcopy(model)
    passes = ["canonicalize_moe", "dead_code_elimination", TritonPatterns(force=rewrite)]
    compiled = trex.compile(model, passes=passes, backend="eager")
    loss = compiled(x)
    loss.backward()
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    forward = Counter(n.target for n in compiled.trex.graphs[0].forward.graph.nodes)
    assert forward[torch.ops.trex_triton.rms_norm_forward.default] == (2 if rewrite else 0)
    assert forward[torch.ops.trex_triton.swiglu.default] == (2 if rewrite else 0)
    assert forward[torch.ops.aten.rsqrt.default] == (0 if rewrite else 2)


@pytest.mark.skipif(triton_import_error() is not None, reason="triton not installed")
def test_rewritten_graph_runs_the_triton_kernels_under_the_interpreter():
    assert kernels_run_on(torch.empty(1))  # tests/conftest.py sets TRITON_INTERPRET=1 on machines without a GPU


def test_pass_declines_on_a_cpu_target_and_says_why():
    torch.manual_seed(0)
    compiled = trex.compile(NormSwiGLU(), backend="eager")
    compiled(torch.randn(3, 24)).backward()
    record = next(r for r in compiled.trex.graphs[0].report.records if r.name == "triton_patterns")
    assert not record.modified and "TritonPatterns(force=True)" in record.decisions[0].reason


@pytest.mark.parametrize(
    "family",
    [
        "qwen3-moe",
        pytest.param("deepseek-v3", marks=pytest.mark.slow),
        pytest.param("deepseek-v4", marks=pytest.mark.slow),
    ],
)
def test_moe_primitives_rewritten_to_the_kernels_train_like_eager(family):
    """With the rewrite asked for, every MoE primitive and router of a tiny transformers MoE model (forward and
    backward) runs as a trex_triton kernel op (Triton's interpreter on CPU), and loss and gradients equal
    eager's. The DeepSeek routers' aux-free biases are set non-zero, so they take part in the choice."""
    from trex.models import build_model, tiny_config

    config = tiny_config(family, num_layers=2, hidden_size=32)
    model = build_model(config, seed=0)
    biases = torch.Generator().manual_seed(1)
    for module in model.modules():
        bias = getattr(module, "e_score_correction_bias", None)
        if isinstance(bias, torch.Tensor):
            bias.copy_(torch.randn(bias.shape, generator=biases) * 0.1)
    reference = copy.deepcopy(model)
    ids = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    passes = ["canonicalize_moe", "dead_code_elimination", TritonPatterns(force=True)]
    compiled = trex.compile(model, passes=passes, backend=["triton", "eager"])
    loss = compiled(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    expected = reference(input_ids=ids, labels=ids, use_cache=False).loss
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    graph = compiled.trex.graphs[0]
    targets = Counter(n.target for g in (graph.forward, graph.backward) for n in g.graph.nodes)
    kernels, aten = torch.ops.trex_triton, torch.ops.aten
    layers = targets[kernels.moe_permute.default]  # tiny V3's first layer is dense
    assert layers == (1 if family == "deepseek-v3" else 2)
    assert targets[kernels.moe_unpermute.default] == targets[kernels.moe_unpermute_backward.default] == layers
    assert targets[kernels.moe_permute_backward.default] == layers
    assert targets[kernels.grouped_mm.default] == 4 * layers  # 2 forward, 2 input gradients
    assert targets[kernels.grouped_mm_weight_grad.default] == 2 * layers
    assert not any(getattr(t, "namespace", None) == "trex" for t in targets)  # no trex MoE primitive left
    assert graph.lowerings["forward"].counts()["triton"] >= 6
    # every router is rewritten: Qwen3-MoE's softmax, V3's group-limited sigmoid, V4's sqrt-softplus top-k and
    # its hash layer (layer 0: experts from tid2eid, so router_weights); one backward op each
    hashed = 1 if family == "deepseek-v4" else 0
    assert targets[kernels.router_weights.default] == hashed
    assert targets[kernels.router_topk.default] == layers - hashed
    assert targets[kernels.router_topk_backward.default] == layers
    assert targets[aten.gather.default] == targets[aten.scatter_add.default] == 0
    # the top-k left in V4 is its compressed-sparse attention's indexer (layer 1), no router's
    assert targets[aten.topk.default] == (1 if family == "deepseek-v4" else 0)
    assert targets[aten.softplus.default] == targets[aten.softplus_backward.default] == 0


class SoftmaxRouter(torch.nn.Module):
    """transformers' Qwen3-MoE router (fp32 softmax, top-k, optional renormalisation) feeding a weighted sum
    of expert-shaped outputs, so the weights and the logits both get gradients."""

    def __init__(self, normalize: bool, hidden=16, experts=8, top_k=2):
        super().__init__()
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        self.proj = torch.nn.Linear(hidden, experts)
        self.normalize, self.top_k = normalize, top_k

    def forward(self, x):
        logits = self.gate(x)
        probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights /= weights.sum(dim=-1, keepdim=True)
        weights = weights.to(logits.dtype)
        chosen = self.proj(x).gather(1, index)
        return (weights * chosen).float().square().sum()


@pytest.mark.parametrize(
    ("normalize", "dtype"),
    [(True, torch.float32), (False, torch.bfloat16), pytest.param(True, torch.bfloat16, marks=pytest.mark.slow)],
    ids=["normalised-fp32", "raw-bf16", "normalised-bf16"],
)
def test_softmax_router_rewritten_to_router_topk_trains_like_eager(normalize, dtype):
    torch.manual_seed(0)
    model, x = SoftmaxRouter(normalize).to(dtype), torch.randn(12, 16, dtype=dtype)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, passes=[TritonPatterns(force=True)], backend="eager")
    loss = compiled(x)
    loss.backward()
    expected = reference(x)
    expected.backward()
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(loss, expected, **tolerance)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tolerance)
    graph = compiled.trex.graphs[0]
    targets = Counter(n.target for g in (graph.forward, graph.backward) for n in g.graph.nodes)
    assert targets[torch.ops.trex_triton.router_topk.default] == 1
    assert targets[torch.ops.trex_triton.router_topk_backward.default] == 1
    assert not {torch.ops.aten.topk.default, torch.ops.aten._softmax_backward_data.default} & set(targets)
    record = next(r for r in graph.report.records if r.name == "triton_patterns")
    assert [d.data["kernel"] for d in record.decisions] == ["router_topk"]
    assert ("normalised" in record.decisions[0].reason) == normalize


class DeepseekRouterLayer(torch.nn.Module):
    """One of transformers' own DeepSeek routers (V3 top-k, V4 top-k, V4 hash) feeding a weighted sum of
    expert-shaped outputs, so the weights and the router's logits both get gradients. The aux-free bias is
    set so that it changes which experts win (checked by the test)."""

    def __init__(self, kind: str, dtype=torch.float32, **config):
        super().__init__()
        from transformers import DeepseekV3Config, DeepseekV4Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HashRouter, DeepseekV4TopKRouter

        common = dict(hidden_size=16, n_routed_experts=12, num_experts_per_tok=3, vocab_size=32)
        if kind == "v3":
            self.gate = DeepseekV3TopkRouter(DeepseekV3Config(**common, **config))
        else:
            v4 = DeepseekV4Config(**common, **config)
            self.gate = (DeepseekV4HashRouter if kind == "v4-hash" else DeepseekV4TopKRouter)(v4)
        self.kind = kind
        torch.nn.init.normal_(self.gate.weight, std=0.5)
        if kind == "v4-hash":  # distinct experts per token, as trex.models' tiny V4 tables
            table = torch.stack([torch.randperm(12)[:3] for _ in range(32)])
            self.gate.tid2eid.copy_(table)
        else:
            self.gate.e_score_correction_bias.copy_(torch.randn(12) * 0.3)
        self.proj = torch.nn.Linear(16, 12)
        self.to(dtype)
        if kind != "v4-hash":
            self.gate.e_score_correction_bias.data = self.gate.e_score_correction_bias.float()  # kept in fp32

    def forward(self, x, ids):
        _, weights, index = self.gate(x, ids) if self.kind == "v4-hash" else self.gate(x)
        chosen = self.proj(x).gather(1, index)
        return (weights.to(x.dtype) * chosen).float().square().sum()


DEEPSEEK_ROUTERS = {
    "v3-group-limited": ("v3", dict(n_group=4, topk_group=2, routed_scaling_factor=2.5)),
    "v3-one-group-raw": ("v3", dict(n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0)),
    "v4-topk": ("v4", dict(scoring_func="sqrtsoftplus", routed_scaling_factor=1.5)),
    "v4-topk-sigmoid": ("v4", dict(scoring_func="sigmoid", routed_scaling_factor=1.5)),
    "v4-hash": ("v4-hash", dict(scoring_func="sqrtsoftplus", routed_scaling_factor=1.5)),
    # a bf16 model: V3 computes its router in fp32 whatever the model's dtype, so it is rewritten too
    "v3-bf16": ("v3", dict(n_group=4, topk_group=2, routed_scaling_factor=2.5)),
}


@pytest.mark.parametrize("router", list(DEEPSEEK_ROUTERS))
def test_deepseek_router_rewritten_to_the_router_kernels_trains_like_eager(router):
    """transformers' DeepSeek-V3 router (sigmoid, aux-free bias in the choice only, group-limited top-k,
    normalised, scaled) and DeepSeek-V4's (sqrt-softplus or sigmoid top-k; hash layers with experts from a
    table): the whole region, forward and backward, becomes one router kernel op and router_topk_backward;
    loss and gradients (the router's weight, through the scores) equal eager's, and the bias gets none."""
    kind, config = DEEPSEEK_ROUTERS[router]
    dtype = torch.bfloat16 if router.endswith("bf16") else torch.float32
    torch.manual_seed(0)
    model = DeepseekRouterLayer(kind, dtype, **config)
    x, ids = torch.randn(10, 16, dtype=dtype), torch.randint(0, 32, (10,))
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, passes=[TritonPatterns(force=True)], backend="eager")
    loss = compiled(x, ids)
    loss.backward()
    expected = reference(x, ids)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    tolerance = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tolerance, msg=name)
    if kind != "v4-hash":  # the bias moved the choice of some token (else the test would not test it)
        logits = x.float() @ reference.gate.weight.float().T
        scores = reference.gate.score_fn(logits) if kind == "v4" else torch.sigmoid(logits)
        unbiased = torch.topk(scores, 3).indices.sort(-1).values
        biased = torch.topk(scores + reference.gate.e_score_correction_bias, 3).indices.sort(-1).values
        assert not torch.equal(unbiased, biased)
    graph = compiled.trex.graphs[0]
    targets = Counter(n.target for g in (graph.forward, graph.backward) for n in g.graph.nodes)
    kernels, aten = torch.ops.trex_triton, torch.ops.aten
    kernel = kernels.router_weights if kind == "v4-hash" else kernels.router_topk
    assert targets[kernel.default] == targets[kernels.router_topk_backward.default] == 1
    # the region is gone: no score function or its backward, no top-k, masking or scatter of the gradient; the
    # one gather left is the test's own (proj(x).gather) and its backward's scatter_add
    gone = [aten.topk.default, aten.sigmoid.default, aten.sigmoid_backward.default, aten.softplus.default]
    gone += [aten.softplus_backward.default, aten.masked_fill.Scalar, aten.scatter.value]
    assert {t: targets[t] for t in gone if targets[t]} == {}
    assert targets[aten.gather.default] == 1 and targets[aten.scatter_add.default] == 1
    record = next(r for r in graph.report.records if r.name == "triton_patterns")
    (decision,) = [d for d in record.decisions if d.data.get("kernel", "").startswith("router")]
    assert decision.action == "rewrite" and decision.data["kernel"] == kernel.__name__.split(".")[-1]
    if router == "v3-group-limited":
        assert (decision.data["n_group"], decision.data["topk_group"]) == (4, 2)
        assert "group-limited (2 of 4 groups)" in decision.reason and "scaled by 2.5" in decision.reason


def test_deepseek_v4_router_with_bf16_scores_is_left_in_aten_and_says_why():
    """DeepSeek-V4 computes its scores in the model's dtype; in bf16 the kernel (fp32 scores) would round
    differently, so the region stays and the dump says why."""
    torch.manual_seed(0)
    model = DeepseekRouterLayer("v4", dtype=torch.bfloat16, scoring_func="sqrtsoftplus", routed_scaling_factor=1.5)
    compiled = trex.compile(model, passes=[TritonPatterns(force=True)], backend="eager")
    compiled(torch.randn(10, 16, dtype=torch.bfloat16), torch.randint(0, 32, (10,))).backward()
    graph = compiled.trex.graphs[0]
    targets = Counter(n.target for g in (graph.forward, graph.backward) for n in g.graph.nodes)
    assert targets[torch.ops.trex_triton.router_topk.default] == 0 and targets[torch.ops.aten.topk.default] == 1
    record = next(r for r in graph.report.records if r.name == "triton_patterns")
    (skip,) = [d for d in record.decisions if d.action == "skip"]
    assert "computed in torch.bfloat16" in skip.reason and not record.modified


def test_router_bias_gets_no_gradient_even_as_a_trainable_parameter():
    """The aux-free bias only moves the choice (eager's top-k values are unused), so autograd gives it no
    gradient; the rewritten router gives it none either, even when a user makes it a Parameter."""
    torch.manual_seed(0)
    model = DeepseekRouterLayer("v3", n_group=4, topk_group=2, routed_scaling_factor=2.5)
    bias = model.gate.e_score_correction_bias.detach().clone()
    del model.gate.e_score_correction_bias
    model.gate.e_score_correction_bias = torch.nn.Parameter(bias)
    x, ids = torch.randn(10, 16), torch.randint(0, 32, (10,))
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, passes=[TritonPatterns(force=True)], backend="eager")
    compiled(x, ids).backward()
    reference(x, ids).backward()
    assert reference.gate.e_score_correction_bias.grad is None
    assert model.gate.e_score_correction_bias.grad is None
    torch.testing.assert_close(model.gate.weight.grad, reference.gate.weight.grad, rtol=1e-4, atol=1e-5)
    graph = compiled.trex.graphs[0]
    assert any(n.target == torch.ops.trex_triton.router_topk.default for n in graph.forward.graph.nodes)


@pytest.mark.parametrize("router", ["v3-group-limited", "v4-topk", "v4-hash"])
def test_deepseek_router_rewritten_in_an_inference_graph(router):
    """Without autograd (serving) the graph has no backward: the forward region alone becomes the kernel op,
    the decision says so, and the output equals eager's."""
    kind, config = DEEPSEEK_ROUTERS[router]
    torch.manual_seed(0)
    model = DeepseekRouterLayer(kind, **config)
    x, ids = torch.randn(10, 16), torch.randint(0, 32, (10,))
    compiled = trex.compile(model, passes=[TritonPatterns(force=True)], backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, ids), model(x, ids), rtol=1e-5, atol=1e-5)
    graph = compiled.trex.graphs[0]
    assert graph.backward is None
    kernel = torch.ops.trex_triton.router_weights if kind == "v4-hash" else torch.ops.trex_triton.router_topk
    assert sum(n.target == kernel.default for n in graph.forward.graph.nodes) == 1
    record = next(r for r in graph.report.records if r.name == "triton_patterns")
    assert "forward only" in record.decisions[0].reason
