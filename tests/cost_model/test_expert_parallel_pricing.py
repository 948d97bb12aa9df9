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


def _experts_inputs(rows_name: str) -> tuple[fx.Graph, fx.Node, fx.Node, fx.Node, fx.Node]:
    """A graph with the rows an experts node takes ([rows, HIDDEN]), the received counts and both expert weights."""
    graph = fx.Graph()
    rows = _placeholder(graph, rows_name, TOKENS * TOP_K, HIDDEN)
    recv_counts = _placeholder(graph, "recv_counts", 2, LOCAL_EXPERTS, dtype=torch.int64)
    gate_up = _placeholder(graph, "gate_up_proj", LOCAL_EXPERTS, 2 * INNER, HIDDEN)
    down = _placeholder(graph, "down_proj", LOCAL_EXPERTS, HIDDEN, INNER)
    return graph, rows, recv_counts, gate_up, down


def experts_node() -> fx.Node:
    graph, received, recv_counts, gate_up, down = _experts_inputs("received")
    args = (received, recv_counts, gate_up, down, "silu", 0.0, False, TOKENS * TOP_K)
    return graph.call_function(torch.ops.trex.ep_experts_local.default, args)


def backward_nodes() -> tuple[fx.Node, fx.Node]:
    """The local experts' backward as the captured graph holds it: data gradients, then weight gradients."""
    graph, grad, recv_counts, gate_up, down = _experts_inputs("grad_out")
    rows = TOKENS * TOP_K
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
    data, weight = (annotate_node(node, cluster) for node in backward_nodes())
    assert forward.priced and data.priced and weight.priced, (forward.note, data.note, weight.note)
    rows = TOKENS * TOP_K  # balanced routing: a rank receives as many rows as it sends (expected_rows)
    assert forward.bindings["S"] == rows and "bytes_in" not in forward.bindings
    assert forward.flops >= 2 * rows * HIDDEN * 2 * INNER + 2 * rows * INNER * HIDDEN
    assert data.flops + weight.flops >= 2 * forward.flops * 0.99
    # no group is needed: the all-to-alls are the exchange nodes', not folded into this one
    assert forward.time_s > 0 and data.time_s + weight.time_s > forward.time_s


def test_an_unknown_group_is_reported_not_priced_at_zero():
    cost = annotate_node(exchange_node(2), cluster_of("h100"))
    assert not cost.priced and "group size unknown" in cost.note


def test_the_fused_expert_parallel_op_is_gone():
    assert not hasattr(torch.ops.trex, "moe_experts_ep")
    assert formula_for(torch.ops.trex.ep_exchange.default) is not None


@pytest.mark.parametrize("target", ["h100", "cpu"])
def test_each_half_of_the_experts_backward_is_priced_on_its_own_gemms(target):
    # the data gradients and the weight gradients do the forward's GEMM FLOPs each; the weight half reduces over the
    # rows (K = rows per expert), so its time comes from its own shapes
    cluster = cluster_of(target)
    forward = annotate_node(experts_node(), cluster)
    data, weight = (annotate_node(node, cluster) for node in backward_nodes())
    gemm_flops = 2 * TOKENS * TOP_K * HIDDEN * 3 * INNER
    assert data.flops >= gemm_flops and weight.flops >= gemm_flops
    assert data.time_s > 0 and weight.time_s > 0
    assert 1.0 < (data.time_s + weight.time_s) / forward.time_s < 4.0


def test_the_two_backward_nodes_give_the_gradients_of_the_experts_math():
    torch.manual_seed(0)
    experts, hidden, inner = 3, 16, 8
    recv_counts = torch.tensor([[5, 9, 6], [7, 4, 9]])  # rows from rank 0 then rank 1, by local expert
    rows = int(recv_counts.sum())
    leaves = [
        torch.randn(rows, hidden, dtype=torch.float64),
        torch.randn(experts, 2 * inner, hidden, dtype=torch.float64),
        torch.randn(experts, hidden, inner, dtype=torch.float64),
    ]
    grad = torch.randn(rows, hidden, dtype=torch.float64)
    tail = ("silu", 0.0, False, rows)
    mine = [t.clone().requires_grad_() for t in leaves]
    torch.ops.trex.ep_experts_local(mine[0], recv_counts, mine[1], mine[2], *tail)[0].backward(grad)
    # the same math, row by row, with torch's autograd
    ref = [t.clone().requires_grad_() for t in leaves]
    expert_of = torch.arange(experts).repeat(2).repeat_interleave(recv_counts.reshape(-1))
    outs = []
    for row, e in zip(ref[0], expert_of.tolist()):
        gate, up = (row @ ref[1][e].t()).chunk(2)
        outs.append((torch.nn.functional.silu(gate) * up) @ ref[2][e].t())
    torch.stack(outs).backward(grad)
    for got, want in zip(mine, ref):
        assert torch.allclose(got.grad, want.grad, rtol=1e-10, atol=1e-10)


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
