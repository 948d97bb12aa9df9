"""The cost model prices the expert-parallel layer's graph nodes: each `trex.ep_exchange` as an all-to-all over its
group, `trex.ep_experts_local` as the local experts' grouped GEMMs at the balanced-routing row count."""

from __future__ import annotations

import pytest
import torch
from torch import fx

import trex.runtime.expert_parallel  # noqa: F401 - registers the torch.ops.trex.ep_* ops
from trex.cost_model import collectives
from trex.cost_model.annotate import annotate_node, cluster_of
from trex.cost_model.op_formulas import formula_for

TOKENS, HIDDEN, INNER, LOCAL_EXPERTS, TOP_K = 512, 1024, 512, 4, 2


def _placeholder(graph: fx.Graph, name: str, *shape: int, dtype=torch.bfloat16) -> fx.Node:
    node = graph.placeholder(name)
    node.meta["val"] = torch.empty(shape, dtype=dtype, device="meta")
    return node


def exchange_node(ep: int) -> fx.Node:
    """The combine's exchange: this rank sends TOKENS * TOP_K expert-output rows back (a known size)."""
    graph = fx.Graph()
    rows = _placeholder(graph, "local_out", TOKENS * TOP_K, HIDDEN)
    send = _placeholder(graph, "send_counts", ep, dtype=torch.int64)
    recv = _placeholder(graph, "recv_counts", ep, dtype=torch.int64)
    node = graph.call_function(torch.ops.trex.ep_exchange.default, (rows, send, recv, TOKENS * TOP_K, "ep_group"))
    node.meta["val"] = torch.empty(TOKENS * TOP_K, HIDDEN, dtype=torch.bfloat16, device="meta")
    return node


def experts_node(backward: bool = False) -> fx.Node:
    graph = fx.Graph()
    rows = TOKENS * TOP_K
    received = _placeholder(graph, "received", rows, HIDDEN)
    recv_counts = _placeholder(graph, "recv_counts", 2, LOCAL_EXPERTS, dtype=torch.int64)
    gate_up = _placeholder(graph, "gate_up_proj", LOCAL_EXPERTS, 2 * INNER, HIDDEN)
    down = _placeholder(graph, "down_proj", LOCAL_EXPERTS, HIDDEN, INNER)
    if not backward:
        args = (received, recv_counts, gate_up, down, "silu", 0.0, False, rows)
        return graph.call_function(torch.ops.trex.ep_experts_local.default, args)
    regroup = _placeholder(graph, "regroup", rows, dtype=torch.int64)
    gate_up_out = _placeholder(graph, "gate_up_out", rows, 2 * INNER)
    args = (received, recv_counts, gate_up, down, regroup, received, gate_up_out, "silu", 0.0, False, rows)
    return graph.call_function(torch.ops.trex.ep_experts_local_backward.default, args)


@pytest.mark.parametrize("ep", [2, 8])
def test_an_exchange_costs_one_all_to_all_of_the_rows_it_sends(ep):
    cluster = cluster_of("h100")
    cost = annotate_node(exchange_node(ep), cluster, groups={"ep_group": list(range(ep))})
    assert cost.priced, cost.note
    sent = TOKENS * TOP_K * HIDDEN * 2  # bf16 rows
    assert cost.bindings["bytes_in"] == sent
    assert cost.time_s == pytest.approx(collectives.all_to_all(sent, cluster.placement(tuple(range(ep)))), rel=1e-9)
    wider = annotate_node(exchange_node(ep), cluster, groups={"ep_group": list(range(2 * ep))})
    assert wider.time_s > 0


def test_the_local_experts_cost_their_grouped_gemms_and_no_exchange():
    cluster = cluster_of("h100")
    forward = annotate_node(experts_node(), cluster)
    backward = annotate_node(experts_node(backward=True), cluster)
    assert forward.priced and backward.priced, (forward.note, backward.note)
    rows = TOKENS * TOP_K  # balanced routing: a rank receives as many rows as it sends (expected_rows)
    assert forward.bindings["S"] == rows and "bytes_in" not in forward.bindings
    assert forward.flops >= 2 * rows * HIDDEN * 2 * INNER + 2 * rows * INNER * HIDDEN
    assert backward.flops >= 2 * forward.flops * 0.99
    # no group is needed: the all-to-alls are the exchange nodes', not folded into this one
    assert forward.time_s > 0 and backward.time_s > forward.time_s


def test_an_unknown_group_is_reported_not_priced_at_zero():
    cost = annotate_node(exchange_node(2), cluster_of("h100"))
    assert not cost.priced and "group size unknown" in cost.note


def test_the_fused_expert_parallel_op_is_gone():
    assert not hasattr(torch.ops.trex, "moe_experts_ep")
    assert formula_for(torch.ops.trex.ep_exchange.default) is not None


def _split_backward_nodes() -> tuple[fx.Node, fx.Node]:
    graph = fx.Graph()
    rows = TOKENS * TOP_K
    grad = _placeholder(graph, "grad_out", rows, HIDDEN)
    recv_counts = _placeholder(graph, "recv_counts", 2, LOCAL_EXPERTS, dtype=torch.int64)
    gate_up = _placeholder(graph, "gate_up_proj", LOCAL_EXPERTS, 2 * INNER, HIDDEN)
    down = _placeholder(graph, "down_proj", LOCAL_EXPERTS, HIDDEN, INNER)
    regroup = _placeholder(graph, "regroup", rows, dtype=torch.int64)
    gate_up_out = _placeholder(graph, "gate_up_out", rows, 2 * INNER)
    tail = ("silu", 0.0, False, rows)
    data = graph.call_function(
        torch.ops.trex.ep_experts_local_input_backward.default,
        (grad, recv_counts, gate_up, down, regroup, gate_up_out, *tail),
    )
    data.meta["val"] = (grad.meta["val"], grad.meta["val"], gate_up_out.meta["val"])
    weight = graph.call_function(
        torch.ops.trex.ep_experts_local_weight_backward.default,
        (grad, recv_counts, gate_up, down, grad, gate_up_out, gate_up_out, *tail),
    )
    weight.meta["val"] = (gate_up.meta["val"], down.meta["val"])
    return data, weight


@pytest.mark.parametrize("target", ["h100", "cpu"])
def test_the_two_halves_of_the_experts_backward_cost_what_the_whole_does(target):
    # the data gradients and the weight gradients: the forward's GEMM FLOPs each; the weight half reduces over the
    # rows (K = rows per expert), so its time is its own shapes', not a copy of the data half's
    cluster = cluster_of(target)
    data, weight = (annotate_node(node, cluster) for node in _split_backward_nodes())
    whole = annotate_node(experts_node(backward=True), cluster)
    assert data.priced and weight.priced, (data.note, weight.note)
    gemm_flops = 2 * TOKENS * TOP_K * HIDDEN * 3 * INNER
    assert data.flops >= gemm_flops and weight.flops >= gemm_flops
    assert data.flops + weight.flops == pytest.approx(whole.flops, rel=0.05)
    assert data.time_s > 0 and weight.time_s > 0
    assert 0.5 < (data.time_s + weight.time_s) / whole.time_s < 2.0


def test_the_split_backward_ops_give_the_one_node_backward_bit_for_bit():
    torch.manual_seed(0)
    experts, hidden, inner, rows = 3, 16, 8, 40
    recv_counts = torch.tensor([[5, 9, 6], [7, 4, 9]])
    gate_up = torch.randn(experts, 2 * inner, hidden)
    down = torch.randn(experts, hidden, inner)
    received = torch.randn(rows, hidden)
    tail = ("silu", 0.0, False, rows)
    out, regroup, grouped_in, gate_up_out = torch.ops.trex.ep_experts_local(received, recv_counts, gate_up, down, *tail)
    grad = torch.randn_like(out)
    whole = torch.ops.trex.ep_experts_local_backward(
        grad, recv_counts, gate_up, down, regroup, grouped_in, gate_up_out, *tail
    )
    grad_received, grad_local_out, grad_gate_up_out = torch.ops.trex.ep_experts_local_input_backward(
        grad, recv_counts, gate_up, down, regroup, gate_up_out, *tail
    )
    weights = torch.ops.trex.ep_experts_local_weight_backward(
        grad_local_out, recv_counts, gate_up, down, grouped_in, gate_up_out, grad_gate_up_out, *tail
    )
    for got, want in zip((grad_received, *weights), whole):
        assert torch.equal(got, want)
    # and autograd through the forward op takes the split path: the same gradients again
    leaves = [t.clone().requires_grad_() for t in (received, gate_up, down)]
    torch.ops.trex.ep_experts_local(leaves[0], recv_counts, leaves[1], leaves[2], *tail)[0].backward(grad)
    for leaf, want in zip(leaves, whole):
        assert torch.equal(leaf.grad, want)


def test_a_measured_grouped_gemm_call_pays_its_launches_once():
    # `trex calibrate` measures a grouped GEMM call whole (its per-group launches included): the modelled
    # per-group launches are not added on top of it
    from dataclasses import replace

    import trex.ops  # noqa: F401 - registers torch.ops.trex.grouped_mm
    from trex.cost_model.devices import _uncalibrated_cpu

    graph = fx.Graph()
    rows = _placeholder(graph, "rows", 256, 64, dtype=torch.float32)
    weight = _placeholder(graph, "weight", 8, 64, 32, dtype=torch.float32)
    offsets = _placeholder(graph, "offsets", 8, dtype=torch.int32)
    node = graph.call_function(torch.ops.trex.grouped_mm.default, (rows, weight, offsets))
    node.meta["val"] = torch.empty(256, 32, device="meta")
    cpu = _uncalibrated_cpu()
    one_launch = replace(cpu, gemm=replace(cpu.gemm, launch_per_group=False))
    measured = {"trex.grouped_mm": 50.0}
    per_group = annotate_node(node, cluster_of(replace(cpu, op_overhead_us=measured))).time_s
    once = annotate_node(node, cluster_of(replace(one_launch, op_overhead_us=measured))).time_s
    assert per_group == pytest.approx(once, rel=1e-12)
    # unmeasured, the call is priced with its 8 launches
    launches = cpu.gemm_launch_s("fp32", 8) - cpu.gemm_launch_s("fp32")
    unmeasured = annotate_node(node, cluster_of(cpu)).time_s - annotate_node(node, cluster_of(one_launch)).time_s
    assert unmeasured == pytest.approx(launches, rel=1e-9)
