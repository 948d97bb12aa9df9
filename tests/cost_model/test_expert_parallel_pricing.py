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
