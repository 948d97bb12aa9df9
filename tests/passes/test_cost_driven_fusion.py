"""Cost-driven fusion groups memory-bound chains by the bytes they save, and the lowering hands each
group whole to one backend."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import fx

import trex
from trex.backends import Backend
from trex.backends.eager import EagerBackend
from trex.backends.lowering import assign_nodes
from trex.pass_manager import PassContext
from trex.passes import CostDrivenFusion


def _traced(fn, *inputs) -> fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*inputs)


def _groups(gm):
    groups = {}
    for node in gm.graph.nodes:
        if "fusion_group" in node.meta:
            groups.setdefault(node.meta["fusion_group"], []).append(node)
    return groups


def test_a_pointwise_chain_becomes_one_group_with_its_saving_recorded():
    gm = _traced(lambda x, y: torch.exp(x * 2 + y).sum(-1), torch.randn(64, 128), torch.randn(64, 128))
    result = CostDrivenFusion().run(gm, PassContext())
    groups = _groups(gm)
    assert len(groups) == 1
    (members,) = groups.values()
    assert {n.target for n in members} == {
        torch.ops.aten.mul.Tensor,
        torch.ops.aten.add.Tensor,
        torch.ops.aten.exp.default,
        torch.ops.aten.sum.dim_IntList,
    }
    fused = [d for d in result.decisions if d.action == "fuse"]
    assert len(fused) == 3
    # each fused intermediate is [64, 128] fp32 with one user: written once and read once
    assert all(d.data["saved_bytes"] == 2 * 64 * 128 * 4 and d.data["saved_s"] > 0 for d in fused)


def test_values_used_outside_the_chain_end_a_group_and_gemms_are_never_fused():
    def fn(x, w):
        a = torch.relu(x)
        b = a @ w  # a GEMM between two pointwise chains
        return torch.sigmoid(b) + 1, a * 3

    gm = _traced(fn, torch.randn(8, 16), torch.randn(16, 16))
    CostDrivenFusion().run(gm, PassContext())
    for members in _groups(gm).values():
        assert all(n.target is not torch.ops.aten.mm.default for n in members)
        inside = set(members)
        leaving = [n for n in members if any(u not in inside for u in n.users)]
        assert len(leaving) <= 1 or all(u.op == "output" for n in leaving for u in n.users if u not in inside)
    relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
    assert "fusion_group" not in relu.meta or relu.meta["fusion_group"] != next(
        n for n in gm.graph.nodes if n.target is torch.ops.aten.sigmoid.default
    ).meta.get("fusion_group")


def test_a_saving_below_the_threshold_keeps_nodes_apart():
    gm = _traced(lambda x: torch.exp(x * 2), torch.randn(4))
    result = CostDrivenFusion().run(gm, PassContext(options={"fusion_min_saving_s": 1.0}))
    assert not _groups(gm) and [d.action for d in result.decisions] == ["keep_apart"]


class MulOnly(Backend):
    name: ClassVar[str] = "toy_mul_only"
    SUPPORTED: ClassVar[tuple] = (torch.ops.aten.mul.Tensor,)

    def supports(self, node):
        return node.op == "call_function" and node.target in self.SUPPORTED

    def lower(self, gm, example_inputs):
        return gm


class Pointwise(MulOnly):
    name: ClassVar[str] = "toy_pointwise"
    SUPPORTED: ClassVar[tuple] = (torch.ops.aten.mul.Tensor, torch.ops.aten.exp.default)


def test_lowering_gives_a_group_whole_to_a_backend_that_supports_all_of_it():
    gm = _traced(lambda x: torch.exp(x * 2) * 3, torch.randn(32, 32))
    CostDrivenFusion().run(gm, PassContext())
    assert len(_groups(gm)) == 1
    # MulOnly comes first for the muls, but only Pointwise can take the whole group
    assignment, notes = assign_nodes(gm, [MulOnly(), Pointwise(), EagerBackend()])
    assert {b.name for b in assignment.values()} == {"toy_pointwise"}
    assert any("kept whole" in note for note in notes)


def test_a_group_no_backend_supports_whole_is_split_and_the_split_noted():
    gm = _traced(lambda x: torch.exp(x * 2) * 3, torch.randn(32, 32))
    CostDrivenFusion().run(gm, PassContext())
    assignment, notes = assign_nodes(gm, [MulOnly(), EagerBackend()])
    assert sorted(b.name for b in assignment.values()) == ["eager", "toy_mul_only", "toy_mul_only"]
    assert any("no backend supports all of it" in note for note in notes)


def test_fusion_runs_in_the_default_pipeline_and_training_matches_eager(small_moe):
    model, x = small_moe
    import copy

    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend="eager")
    loss = compiled(x)
    loss.backward()
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    record = next(r for r in compiled.trex.graphs[0].report.records if r.name == "cost_driven_fusion")
    assert any(d.action == "fuse" for d in record.decisions)
