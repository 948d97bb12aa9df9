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


@pytest.mark.parametrize("family", ["qwen3-moe", pytest.param("deepseek-v3", marks=pytest.mark.slow)])
def test_moe_primitives_rewritten_to_the_kernels_train_like_eager(family):
    """With the rewrite asked for, every MoE primitive of a tiny transformers MoE model (forward and backward)
    runs as a trex_triton kernel op (Triton's interpreter on CPU), and loss and gradients equal eager's."""
    from trex.models import build_model, tiny_config

    config = tiny_config(family, num_layers=2, hidden_size=32)
    model = build_model(config, seed=0)
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
    kernels = torch.ops.trex_triton
    layers = targets[kernels.moe_permute.default]  # tiny V3's first layer is dense
    assert layers == (2 if family == "qwen3-moe" else 1)
    assert targets[kernels.moe_unpermute.default] == targets[kernels.moe_unpermute_backward.default] == layers
    assert targets[kernels.moe_permute_backward.default] == layers
    assert targets[kernels.grouped_mm.default] == 4 * layers  # 2 forward, 2 input gradients
    assert targets[kernels.grouped_mm_weight_grad.default] == 2 * layers
    assert not any(getattr(t, "namespace", None) == "trex" for t in targets)  # no trex MoE primitive left
    assert graph.lowerings["forward"].counts()["triton"] >= 6
    # Qwen3-MoE's softmax router is rewritten too; DeepSeek-V3's (sigmoid, group-limited) is not matched
    routers = layers if family == "qwen3-moe" else 0
    assert targets[kernels.router_topk.default] == targets[kernels.router_topk_backward.default] == routers
    assert targets[torch.ops.aten.topk.default] == (0 if family == "qwen3-moe" else layers)


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
