"""The host side of eager training: op counts, host-bound stretches, and the MoE token-count sync."""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from trex.cost_model.catalog import get_cluster
from trex.cost_model.devices import device_profile_from_dict, device_profile_to_dict, get_device
from trex.cost_model.host import HostOps, chunk_host_wait, count_host_ops, host_ops_for
from trex.cost_model.layer_cost import CostContext, LayerCost, layer_cost
from trex.cost_model.model_spec import get_model_spec
from trex.cost_model.parallel import ParallelConfig
from trex.cost_model.step import estimate_step
from trex.errors import TrexError

QWEN3 = get_model_spec("qwen3-235b-a22b")
GPT = get_model_spec("gpt-175b")
# Q3-C's layout: tp=4, intra-node ep=8, one micro-batch of 4096 tokens; the shortest device work per layer of the three rows.
QWEN_PLAN = ParallelConfig(tp=4, pp=8, vpp=4, ep=8, dp=8, seq=4096, gbs=2048, recompute="none", dispatcher="deepep")
GPT_PLAN = ParallelConfig(tp=8, pp=8, vpp=3, dp=1, seq=2048, gbs=64, attention_kernel="unfused")


def _cluster(name: str, devices: int, host_op_us: float):
    cluster = get_cluster(name, devices)
    return cluster.with_device(dataclasses.replace(cluster.device, host_op_us=host_op_us))


def _layer(plan: ParallelConfig, host_op_us: float) -> LayerCost:
    ctx = CostContext.of(plan.with_devices(256), _cluster("h100", 256, host_op_us))
    return layer_cost(QWEN3.layer_kinds["moe"], QWEN3.hidden_size, ctx)


def test_layer_host_time_is_its_ops_times_the_profiles_cost_per_op():
    cost = _layer(QWEN_PLAN, 10.0)
    ops = QWEN3.layer_kinds["moe"].host_ops
    local_experts = 128 / 8
    collectives = len(QWEN3.layer_kinds["moe"].tp_collectives)  # tp=4 issues each one
    assert cost.host_forward_s == pytest.approx((ops.forward + 2 * local_experts + collectives) * 10e-6)
    assert cost.host_backward_s == pytest.approx((ops.backward + 4 * local_experts + collectives) * 10e-6)


def test_grouped_gemms_cost_the_host_one_launch_per_local_expert():
    few = _layer(dataclasses.replace(QWEN_PLAN, ep=32, dp=8), 10.0)  # 4 local experts
    many = _layer(QWEN_PLAN, 10.0)  # 16 local experts
    assert many.host_forward_s - few.host_forward_s == pytest.approx(2 * 12 * 10e-6)
    assert many.host_backward_s - few.host_backward_s == pytest.approx(4 * 12 * 10e-6)


def test_recompute_reissues_the_forward_ops_it_reruns():
    plain = _layer(QWEN_PLAN, 10.0)
    full = _layer(dataclasses.replace(QWEN_PLAN, recompute="full"), 10.0)
    assert full.host_backward_s == pytest.approx(plain.host_backward_s + plain.host_forward_s)


def test_moe_forwards_synchronise_the_host_unless_the_plan_says_otherwise():
    assert _layer(QWEN_PLAN, 10.0).syncs_host
    assert not _layer(dataclasses.replace(QWEN_PLAN, moe_host_sync=False), 10.0).syncs_host
    dense = layer_cost(
        GPT.layers[0], GPT.hidden_size, CostContext.of(GPT_PLAN.with_devices(64), get_cluster("a100", 64))
    )
    assert not dense.syncs_host


def test_a_host_bound_layer_takes_the_host_time_and_the_breakdown_says_so():
    fast_host = estimate_step(QWEN3, _cluster("h100", 256, 0.0), QWEN_PLAN)
    slow_host = estimate_step(QWEN3, _cluster("h100", 256, 200.0), QWEN_PLAN)
    layer = _layer(QWEN_PLAN, 200.0)
    assert layer.host_forward_s > layer.device_forward_s and layer.host_backward_s > layer.device_backward_s
    assert fast_host.breakdown.host_wait_s == 0.0
    per_microbatch = (layer.host_forward_s + layer.host_backward_s) - (layer.device_forward_s + layer.device_backward_s)
    layers_on_slowest = 12  # 94 layers over 32 chunks: the slowest device holds 4 chunks of 3
    assert slow_host.breakdown.host_wait_s == pytest.approx(256 * layers_on_slowest * per_microbatch, rel=0.02)
    assert slow_host.step_time_s > fast_host.step_time_s + 0.9 * slow_host.breakdown.host_wait_s


def test_gpu_bound_runs_do_not_see_the_host():
    with_host = estimate_step(GPT, _cluster("a100", 64, get_device("a100").host_op_us), GPT_PLAN)
    without = estimate_step(GPT, _cluster("a100", 64, 0.0), GPT_PLAN)
    assert with_host.breakdown.host_wait_s == 0.0
    assert with_host.step_time_s == without.step_time_s


def test_breakdown_adds_up_when_the_host_is_the_bottleneck():
    estimate = estimate_step(QWEN3, _cluster("h100", 256, 60.0), QWEN_PLAN)
    b = estimate.breakdown
    assert b.host_wait_s > 0
    assert b.compute_s + b.exposed_comm_s + b.host_wait_s + b.bubble_s + b.optimizer_s == pytest.approx(
        estimate.step_time_s, rel=1e-6
    )


def _priced(host_f: float, device_f: float, host_b: float, device_b: float, syncs: bool) -> LayerCost:
    return LayerCost(
        forward_s=device_f, backward_s=device_b, host_forward_s=host_f, host_backward_s=host_b, syncs_host=syncs
    )


def test_a_sync_stops_host_slack_from_one_layer_covering_another():
    # forward host-bound by 1 ms, backward device-bound by 1 ms: running ahead hides it, a sync does not
    free = chunk_host_wait([(_priced(2e-3, 1e-3, 1e-3, 2e-3, syncs=False), 1)])
    synced = chunk_host_wait([(_priced(2e-3, 1e-3, 1e-3, 2e-3, syncs=True), 1)])
    free_two = chunk_host_wait([(_priced(2e-3, 1e-3, 0.0, 0.0, False), 1), (_priced(0.0, 2e-3, 0.0, 0.0, False), 1)])
    synced_two = chunk_host_wait([(_priced(2e-3, 1e-3, 0.0, 0.0, True), 1), (_priced(0.0, 2e-3, 0.0, 0.0, True), 1)])
    assert free == (pytest.approx(1e-3), 0.0) and synced == (
        pytest.approx(1e-3),
        0.0,
    )  # forward and backward never share a stretch
    assert free_two == (0.0, 0.0)  # the second layer's device time covers the first layer's host time
    assert synced_two == (pytest.approx(1e-3), 0.0)  # the sync between them does not let it


times = st.floats(min_value=0.0, max_value=1e-2, allow_nan=False)
layers = st.lists(st.tuples(times, times, times, times, st.booleans(), st.integers(1, 4)), min_size=1, max_size=6)


@given(layers)
def test_host_wait_lies_between_full_overlap_and_no_overlap(parts):
    priced = [(_priced(hf, df, hb, db, sync), n) for hf, df, hb, db, sync, n in parts]
    wait_f, wait_b = chunk_host_wait(priced)
    host = sum(n * (hf + hb) for hf, _, hb, _, _, n in parts)
    device = sum(n * (df + db) for _, df, _, db, _, n in parts)
    total = device + wait_f + wait_b
    assert total >= max(host, device) - 1e-12  # never faster than the slower side
    assert total <= host + device + 1e-12  # never slower than no overlap at all


@given(layers)
def test_synchronising_never_makes_a_chunk_faster(parts):
    synced = chunk_host_wait([(_priced(hf, df, hb, db, True), n) for hf, df, hb, db, _, n in parts])
    free = chunk_host_wait([(_priced(hf, df, hb, db, False), n) for hf, df, hb, db, _, n in parts])
    assert sum(synced) >= sum(free) - 1e-12


@given(st.floats(min_value=0.0, max_value=80.0), st.floats(min_value=0.0, max_value=80.0))
def test_step_time_never_decreases_with_the_host_cost_per_op(a, b):
    low, high = sorted((a, b))
    assert (
        estimate_step(QWEN3, _cluster("h100", 256, high), QWEN_PLAN).step_time_s
        >= estimate_step(QWEN3, _cluster("h100", 256, low), QWEN_PLAN).step_time_s
    )


def test_host_cost_per_op_round_trips_through_a_profile_file_and_is_validated():
    profile = get_device("h100")
    data = device_profile_to_dict(profile)
    assert device_profile_from_dict(data).host_op_us == profile.host_op_us == pytest.approx(13.5)
    data["device"]["host_op_us"] = -1
    with pytest.raises(TrexError, match="host_op_us.*>= 0"):
        device_profile_from_dict(data)


def test_every_built_in_layer_has_a_stored_op_count_with_its_provenance():
    for name in ("gpt-175b", "pangu-ultra-135b", "qwen3-235b-a22b", "deepseek-v3", "deepseek-v4-flash"):
        spec = get_model_spec(name)
        for layer in (*spec.layers, *spec.mtp_layers):
            assert layer.host_ops is not None and layer.host_ops.source.startswith("trex.meta_capture"), (
                name,
                layer.kind,
            )
    with pytest.raises(TrexError, match="no host-op count for layer structure 'nope'"):
        host_ops_for("nope")


def test_counting_skips_views_and_separates_grouped_gemms():
    def layer(x, w):
        y = torch.ops.aten.mm.default(x.view(4, 8), w)
        return torch.ops.aten.relu.default(y).t()

    graph = torch.fx.symbolic_trace(layer)
    assert count_host_ops(graph, torch.fx.Graph()) == HostOps(2, 0, 0, 0)  # mm + relu; view and t issue nothing


@pytest.mark.parametrize("structure", ["qwen3-moe.moe", "llama.dense"])
def test_stored_counts_match_a_fresh_capture(structure):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "cost_model" / "count_host_ops.py"
    spec = importlib.util.spec_from_file_location("count_host_ops", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    family = structure.split(".")[0]
    from trex.meta_capture import capture_model

    capture = capture_model(module.configs()[family], seq=64, include_ends=False)
    (kind,) = [k for k in capture.kinds if f"{family}.{module.kind_key(family, k.name)}" == structure]
    fresh = count_host_ops(kind.graph.forward, kind.graph.backward)
    stored = host_ops_for(structure)
    assert (fresh.forward, fresh.backward, fresh.expert_gemms_forward, fresh.expert_gemms_backward) == (
        stored.forward,
        stored.backward,
        stored.expert_gemms_forward,
        stored.expert_gemms_backward,
    )
