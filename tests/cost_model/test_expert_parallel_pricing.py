"""The cost model prices the expert-parallel op `trex.moe_experts_ep` with its two all-to-alls."""

from __future__ import annotations

import pytest
import torch
from torch import fx

import trex.runtime.expert_parallel  # noqa: F401 - registers torch.ops.trex.moe_experts_ep
from trex.cost_model import collectives
from trex.cost_model.annotate import annotate_node, cluster_of

TOKENS, HIDDEN, INNER, LOCAL_EXPERTS, TOP_K = 512, 1024, 512, 4, 2


def ep_node() -> fx.Node:
    """A captured-graph node of the op with FakeTensor-like metadata (plain tensors on the meta device)."""
    graph = fx.Graph()

    def placeholder(name: str, *shape: int, dtype=torch.bfloat16) -> fx.Node:
        node = graph.placeholder(name)
        node.meta["val"] = torch.empty(shape, dtype=dtype, device="meta")
        return node

    hidden = placeholder("hidden", TOKENS, HIDDEN)
    index = placeholder("top_k_index", TOKENS, TOP_K, dtype=torch.int64)
    weights = placeholder("top_k_weights", TOKENS, TOP_K, dtype=torch.float32)
    gate_up = placeholder("gate_up_proj", LOCAL_EXPERTS, 2 * INNER, HIDDEN)
    down = placeholder("down_proj", LOCAL_EXPERTS, HIDDEN, INNER)
    args = (hidden, index, weights, gate_up, down, "silu", 0.0, False, "ep_group")
    return graph.call_function(torch.ops.trex.moe_experts_ep.default, args)


@pytest.mark.parametrize("ep", [2, 8])
def test_the_ep_op_costs_its_local_experts_plus_two_all_to_alls(ep):
    node = ep_node()
    cluster = cluster_of("h100")
    alone = annotate_node(node, cluster, groups={"ep_group": [0]})
    spread = annotate_node(node, cluster, groups={"ep_group": list(range(ep))})
    assert alone.priced and spread.priced, (alone.note, spread.note)
    rows = TOKENS * TOP_K  # balanced routing: a rank receives as many rows as it sends
    exchange = rows * HIDDEN * 2  # bf16 hidden vectors
    assert spread.bindings["bytes_in"] == exchange and spread.bindings["S"] == rows
    a2a = collectives.all_to_all(exchange, cluster.placement(tuple(range(ep))))
    assert a2a > 0
    assert spread.time_s == pytest.approx(alone.time_s + 2 * a2a, rel=1e-9)
    # the GEMM FLOPs are those of the local experts over the received rows
    assert spread.flops >= 2 * rows * HIDDEN * 2 * INNER + 2 * rows * INNER * HIDDEN


def test_an_unknown_group_is_reported_not_priced_at_zero():
    cost = annotate_node(ep_node(), cluster_of("h100"))
    assert not cost.priced and "group size unknown" in cost.note
