"""Every shipped pass keeps the program's meaning on hypothesis-generated graphs and real models."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import trex
from trex.passes import PASSES, CanonicalizeMoe, DeadCodeElimination
from trex.passes.canonicalize.moe import MoeRegion
from trex.testing import assert_pass_preserves_semantics, graphs, moe_configs

ALL_PASSES = [cls() for cls in PASSES.values()]


@pytest.mark.parametrize("pass_", ALL_PASSES, ids=lambda p: p.name)
@given(case=graphs())
def test_pass_preserves_semantics_on_random_graphs(pass_, case):
    assert_pass_preserves_semantics(pass_, case.gm, case.inputs)


@pytest.mark.parametrize("pass_", ALL_PASSES, ids=lambda p: p.name)
@given(case=graphs(joint=True, require_moe=True))
def test_pass_preserves_semantics_on_random_joint_graphs_with_moe(pass_, case):
    assert_pass_preserves_semantics(pass_, case.gm, case.inputs)


@given(case=graphs(joint=True, require_moe=True))
def test_canonicalize_moe_leaves_no_fused_op_and_tags_every_inlined_node(case):
    fused = sum(
        n.target in (torch.ops.trex.moe_experts.default, torch.ops.trex.moe_experts_backward.default)
        for n in case.gm.graph.nodes
    )
    record = assert_pass_preserves_semantics(CanonicalizeMoe(), case.gm, case.inputs)
    assert len(record.decisions) == fused
    targets = [n.target for n in case.gm.graph.nodes]
    assert (
        torch.ops.trex.moe_experts.default not in targets and torch.ops.trex.moe_experts_backward.default not in targets
    )
    for node in case.gm.graph.nodes:
        if str(node.target).startswith("trex."):
            assert isinstance(node.meta.get("trex_moe"), MoeRegion), node.format_node()


def test_dead_code_elimination_never_removes_side_effects():
    def fn(x, buffer):
        buffer.add_(1.0)  # a mutation nobody reads afterwards
        _unused = x.exp()
        return x * 2

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(3), torch.zeros(3))
    record = assert_pass_preserves_semantics(DeadCodeElimination(), gm, [torch.randn(3), torch.zeros(3)])
    assert any(n.target == torch.ops.aten.add_.Tensor for n in gm.graph.nodes)
    assert "exp" in " ".join(d.subject for d in record.decisions)


@settings(max_examples=3)
@given(case=moe_configs(), seed=st.integers(0, 100))
def test_default_pipeline_matches_eager_on_random_tiny_moe_models(case, seed):
    torch._dynamo.reset()
    model = case.build(seed)
    reference = copy.deepcopy(model)
    input_ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(seed))
    compiled = trex.compile(model)
    loss = compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    loss.backward()
    expected = reference(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    expected.backward()
    tolerance = dict(rtol=1e-4, atol=1e-5) if case.dtype == torch.float32 else dict(rtol=5e-2, atol=2e-2)
    torch.testing.assert_close(loss, expected, **tolerance)
    for p, q in zip(model.parameters(), reference.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, **tolerance)
