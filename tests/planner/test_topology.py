"""Tensor- and expert-parallel groups sit inside the fastest tier that holds them."""

from trex.cost_model import get_cluster
from trex.planner.topology import group_placement, holding_tier, placement_problems


def test_an_expert_group_that_would_span_two_cloudmatrix_supernodes_is_rejected():
    # 1024 dies: one full 768-die supernode and a third of a second; the EP group at rank 512 would cross
    cluster = get_cluster("cloudmatrix384", 1024)
    assert placement_problems(cluster, tp=1, ep=512, etp=1) == [
        "ep groups of 512 (stride 1): 1 instance(s) cross a unified-bus domain boundary"
    ]
    assert placement_problems(cluster, tp=1, ep=256, etp=1) == []
    assert group_placement(cluster, "ep", 256, 1).tier.name == "unified-bus"


def test_a_group_larger_than_any_scale_up_domain_sits_on_the_scale_out_tier():
    cluster = get_cluster("cloudmatrix384", 1536)
    placement = group_placement(cluster, "ep", 1024, 1)
    assert placement.tier.name == "roce-400g" and placement.ok


def test_tensor_parallel_groups_that_straddle_nodes_are_rejected():
    cluster = get_cluster("h100", 64)  # 8 GPUs per NVLink node
    assert placement_problems(cluster, tp=8, ep=1, etp=1) == []
    assert placement_problems(cluster, tp=3, ep=1, etp=1)  # a group of 3 crosses a node boundary somewhere
    assert holding_tier(cluster, 8).name == "nvlink4" and holding_tier(cluster, 16).name == "infiniband-ndr"


def test_strided_expert_groups_are_checked_at_their_stride():
    cluster = get_cluster("h100", 64)
    # ep=4 laid over etp=2: ranks {0,2,4,6} span 7 ranks, inside a node; ep=8 at stride 2 spans 15: over InfiniBand, no straddling
    assert group_placement(cluster, "ep", 4, 2).tier.name == "nvlink4" and group_placement(cluster, "ep", 4, 2).ok
    assert group_placement(cluster, "ep", 8, 2).tier.name == "infiniband-ndr"
