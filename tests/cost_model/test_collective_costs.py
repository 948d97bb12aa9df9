"""Alpha-beta collective costs: hand counts, monotonicity, and the hierarchical bound."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trex.cost_model import collectives
from trex.cost_model.catalog import get_cluster
from trex.cost_model.cluster import Cluster, Level, Placement, Tier

NVLINK = Tier("nvlink", 8, 450.0, 3.0, 0.8, "switch")
IB = Tier("ib", None, 50.0, 6.0, 0.8, "switch")


def test_ring_all_gather_matches_the_hand_count():
    placement = Placement(8, (Level(NVLINK, 8),))
    nbytes = 64e6
    expected = 7 * 3e-6 + 7 / 8 * nbytes / (450e9 * 0.8)
    assert collectives.all_gather(nbytes, placement) == pytest.approx(expected)
    assert collectives.reduce_scatter(nbytes, placement) == pytest.approx(expected)
    assert collectives.all_reduce(nbytes, placement) == pytest.approx(2 * expected)


def test_all_to_all_across_nodes_is_set_by_the_slowest_link():
    # 32 ranks, 8 per node: a rank keeps 1/32, sends 7/32 over NVLink and 24/32 over InfiniBand
    placement = Placement(32, (Level(NVLINK, 8), Level(IB, 4)))
    nbytes = 32e6
    per_tier = collectives.all_to_all_tier_bytes(nbytes, placement)
    assert per_tier == {"nvlink": pytest.approx(nbytes * 7 / 32), "ib": pytest.approx(nbytes * 24 / 32)}
    assert collectives.all_to_all(nbytes, placement) == pytest.approx(6e-6 + nbytes * 24 / 32 / (50e9 * 0.8))


def test_uneven_all_to_all_waits_for_the_busiest_rank():
    cluster = get_cluster("h100", 16)
    ranks = [0, 1, 8, 9]
    even = [[0.0 if i == j else 1e6 for j in range(4)] for i in range(4)]
    skewed = [row[:] for row in even]
    skewed[0][2] = 8e6  # rank 0 sends 8 MB across the node boundary
    assert collectives.all_to_all_v(skewed, ranks, cluster) > collectives.all_to_all_v(even, ranks, cluster)
    assert collectives.all_to_all_v(skewed, ranks, cluster) == pytest.approx(
        IB.latency_s + 9e6 / cluster.tiers[1].bandwidth(3)
    )


def test_equal_splits_price_like_the_uniform_all_to_all():
    cluster = get_cluster("h100", 8)
    placement = cluster.placement(range(8))
    send = [[0.0 if i == j else 1e6 for j in range(8)] for i in range(8)]
    assert collectives.all_to_all_v(send, list(range(8)), cluster) == pytest.approx(
        collectives.all_to_all(8e6, placement)
    )


def test_send_recv_is_latency_plus_bytes_over_bandwidth():
    assert collectives.send_recv(1e6, IB) == pytest.approx(6e-6 + 1e6 / 40e9)


tier_strategy = st.builds(
    lambda bw, lat, eff: (bw, lat, eff),
    st.floats(min_value=1.0, max_value=1000.0),
    st.floats(min_value=0.1, max_value=50.0),
    st.floats(min_value=0.3, max_value=1.0),
)


@given(
    small=st.floats(min_value=0, max_value=1e9),
    extra=st.floats(min_value=1, max_value=1e9),
    kind=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]),
    inner=st.sampled_from([2, 4, 8]),
    outer=st.sampled_from([1, 2, 4, 16]),
)
def test_every_collective_costs_more_for_more_bytes(small, extra, kind, inner, outer):
    levels = (Level(NVLINK, inner),) + ((Level(IB, outer),) if outer > 1 else ())
    placement = Placement(inner * outer, levels)
    assert collectives.collective_time(kind, small + extra, placement) >= collectives.collective_time(
        kind, small, placement
    )


@given(
    inner_tier=tier_strategy,
    outer_tier=tier_strategy,
    inner=st.integers(2, 16),
    outer=st.integers(2, 64),
    nbytes=st.floats(min_value=1.0, max_value=1e10),
    kind=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]),
)
def test_hierarchical_never_worse_than_a_flat_ring_on_the_slowest_tier(
    inner_tier, outer_tier, inner, outer, nbytes, kind
):
    (bw_in, lat_in, eff_in), (bw_out, lat_out, eff_out) = inner_tier, outer_tier
    # the inner tier is at least as fast and as quick as the outer one, as in every real cluster
    fast = Tier("fast", inner, max(bw_in, bw_out), min(lat_in, lat_out), max(eff_in, eff_out))
    slow = Tier("slow", None, min(bw_in, bw_out), max(lat_in, lat_out), min(eff_in, eff_out))
    placement = Placement(inner * outer, (Level(fast, inner), Level(slow, outer)))
    hierarchical = collectives.collective_time(kind, nbytes, placement, "hierarchical")
    flat = collectives.collective_time(kind, nbytes, placement, "flat")
    assert hierarchical <= flat * (1 + 1e-9)
    assert collectives.collective_time(kind, nbytes, placement) <= min(hierarchical, flat) * (1 + 1e-9)


def test_a_single_rank_group_communicates_nothing():
    placement = get_cluster("h100", 8).placement([3])
    assert all(collectives.collective_time(k, 1e9, placement) == 0.0 for k in collectives.COLLECTIVES)


def test_full_mesh_tp2_on_910b_gets_one_hccs_link_and_tp8_gets_seven():
    cluster = get_cluster("ascend-910b", 8)
    two, eight = cluster.placement([0, 1]), cluster.placement(range(8))
    # same bytes per peer link: 8-way all-gather of 8x the data takes about as long as 2-way of 2x
    assert collectives.all_gather(8e8, eight) == pytest.approx(collectives.all_gather(2e8, two), rel=0.03)


def test_unknown_collective_is_an_error():
    with pytest.raises(ValueError, match="unknown collective 'gossip'"):
        collectives.collective_time("gossip", 1.0, Placement(2, (Level(NVLINK, 2),)))


def test_cluster_without_levels_is_local():
    cluster = Cluster("solo", "one device", get_cluster("h100").device, (NVLINK, IB), 1)
    assert cluster.placement([0]).describe() == "1 rank (local)"
