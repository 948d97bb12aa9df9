"""Cluster topologies: groups land on the tiers Megatron's rank order puts them on."""

import pytest

from trex.cost_model.catalog import BUILTIN_CLUSTERS, get_cluster
from trex.cost_model.cluster import cluster_from_dict, cluster_to_dict
from trex.errors import TrexError, UnknownNameError


def _describe(cluster, ranks):
    return [(level.tier.name, level.fanout) for level in cluster.placement(ranks).levels]


def test_tensor_parallel_group_stays_inside_an_nvlink_node():
    h100 = get_cluster("h100", 256)
    assert _describe(h100, range(8)) == [("nvlink4", 8)]


def test_expert_parallel_group_of_32_spans_four_nodes():
    h100 = get_cluster("h100", 256)
    assert _describe(h100, range(32)) == [("nvlink4", 8), ("infiniband-ndr", 4)]


def test_strided_data_parallel_group_uses_both_tiers():
    h100 = get_cluster("h100", 256)
    assert _describe(h100, range(0, 32, 2)) == [("nvlink4", 4), ("infiniband-ndr", 4)]
    assert h100.strided_placement(16, 2) == h100.placement(range(0, 32, 2))


def test_pipeline_group_crosses_nodes_only():
    h100 = get_cluster("h100", 256)
    assert _describe(h100, range(0, 256, 32)) == [("infiniband-ndr", 8)]
    assert h100.tier_between(0, 32).name == "infiniband-ndr" and h100.tier_between(3, 5).name == "nvlink4"


def test_cloudmatrix_groups_use_die_pairs_then_the_unified_bus():
    cm = get_cluster("cloudmatrix384", 1024)
    assert _describe(cm, range(16)) == [("die-to-die", 2), ("unified-bus", 8)]
    assert _describe(cm, range(0, 1024, 64)) == [("unified-bus", 12), ("roce-400g", 2)]


def test_full_mesh_bandwidth_grows_with_the_group():
    hccs = BUILTIN_CLUSTERS["ascend-910b"].tiers[0]
    assert hccs.bandwidth(7) == pytest.approx(7 * hccs.bandwidth(1))
    nvlink = BUILTIN_CLUSTERS["h100"].tiers[0]
    assert nvlink.bandwidth(7) == nvlink.bandwidth(1)


def test_device_counts_must_fill_whole_servers():
    with pytest.raises(TrexError, match=r"whole servers of 8 devices; 12 is not a multiple of 8 \(use 8 or 16\)"):
        get_cluster("ascend-910b", 12)
    assert get_cluster("ascend-910b", 4).devices == 4  # part of one server is fine
    assert get_cluster("cloudmatrix384", 1024).devices == 1024  # 64 servers over two supernodes


def test_unknown_cluster_lists_the_named_ones():
    with pytest.raises(UnknownNameError) as error:
        get_cluster("h1000")
    for name in ("a100", "h100", "h800", "h200", "ascend-910b", "ascend-910c", "cloudmatrix384"):
        assert name in str(error.value)


def test_cluster_files_round_trip(tmp_path):
    from trex.cost_model.cluster import load_cluster
    from trex.cost_model.toml_writer import dumps

    original = get_cluster("ascend-910b", 16)
    path = tmp_path / "910b.toml"
    path.write_text(dumps(cluster_to_dict(original)))
    loaded = load_cluster(path)
    assert loaded.tiers == original.tiers and loaded.device == original.device and loaded.devices == 16


def test_a_cluster_file_may_name_a_builtin_device():
    cluster = cluster_from_dict(
        {
            "device": "h800",
            "cluster": {
                "name": "mine",
                "tiers": [
                    {"name": "nvlink", "size": 8, "bandwidth_gbs": 160, "latency_us": 3},
                    {"name": "ib", "bandwidth_gbs": 40, "latency_us": 8},
                ],
            },
        }
    )
    assert cluster.device.name == "h800" and cluster.tiers[-1].size is None


@pytest.mark.parametrize(
    "tiers, message",
    [
        (
            [
                {"name": "a", "size": 8, "bandwidth_gbs": 100, "latency_us": 1},
                {"name": "b", "size": 12, "bandwidth_gbs": 10, "latency_us": 1},
            ],
            r"tiers\[1\].size' \(12\) is not a multiple of the tier inside it \(8\)",
        ),
        ([{"name": "a", "size": 8, "latency_us": 1}], r"tiers\[0\].bandwidth_gbs' is missing"),
        (
            [{"name": "a", "size": 8, "bandwidth_gbs": 100, "latency_us": 1, "topology": "torus"}],
            r"tiers\[0\].topology' is 'torus'; use 'switch' or 'full_mesh'",
        ),
        (
            [{"name": "a", "bandwidth_gbs": 100, "latency_us": 1}, {"name": "b", "bandwidth_gbs": 10, "latency_us": 1}],
            r"tiers\[0\].size' is missing; only the outermost tier may omit",
        ),
    ],
)
def test_bad_cluster_files_name_the_tier_field(tiers, message):
    with pytest.raises(TrexError, match=message):
        cluster_from_dict({"device": "h100", "cluster": {"name": "bad", "tiers": tiers}})
