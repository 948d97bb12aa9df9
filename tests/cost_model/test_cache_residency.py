"""The reuse-distance model of which reads miss the cache, and its price in `annotate` on a device with a cache."""

import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from trex.cost_model.annotate import annotate
from trex.cost_model.cache_residency import cold_read_bytes
from trex.cost_model.devices import BUILTIN_DEVICES

KIB = 1024
MIB = 1024 * KIB


def _graph(fn, *sizes):
    return make_fx(fn, tracing_mode="fake")(*(torch.randn(n) for n in sizes))


def _by_name(gm, cold):
    return {node.name: cold[node] for node in gm.graph.nodes if node in cold}


def _evicting(a, b):
    c = a + b  # reads two graph inputs: compulsory misses
    d = c * 2  # reads c, just written: resident
    big = torch.ones(1 << 20) * 3  # 4 MiB written and read between c's write and its next read
    e = d + big.sum()
    g = c + 1  # c is pushed out by then
    return e, g


def test_hand_counted_misses_under_a_2_mib_lru_cache():
    gm = _graph(_evicting, 1024, 1024)
    cold = _by_name(gm, cold_read_bytes(gm.graph, 2 * MIB))
    assert cold["add"] == 2 * 4 * KIB  # both inputs: first touched here
    assert cold["mul"] == 0.0  # c was the last thing written
    assert cold["ones"] == 0.0  # reads nothing
    # a 4 MiB tensor read right after its write: the cache holds 2 MiB of it, the rest comes from memory
    assert cold["mul_1"] == 2 * MIB and cold["sum_1"] == 2 * MIB
    assert cold["add_1"] == 4 * KIB and cold["add_2"] == 4 * KIB  # d and c: 8 MiB touched since


def test_a_large_enough_cache_holds_everything_but_the_graph_inputs():
    gm = _graph(_evicting, 1024, 1024)
    cold = _by_name(gm, cold_read_bytes(gm.graph, 64 * MIB))
    assert cold["add"] == 8 * KIB
    assert sum(v for k, v in cold.items() if k != "add") == 0.0


def test_misses_never_grow_with_the_cache():
    gm = _graph(_evicting, 1024, 1024)
    totals = [sum(cold_read_bytes(gm.graph, size * KIB).values()) for size in (4, 64, 1024, 2048, 4096, 16384)]
    assert totals == sorted(totals, reverse=True)


def test_a_read_through_a_view_is_a_read_of_its_base_and_partial_eviction_is_counted():
    def fn(a):
        b = a * 2  # 1 MiB
        c = torch.ones(1 << 18) + 1  # 1 MiB written and read between b's write and its read
        v = b.view(512, 512)
        return v.t() + c.view(512, 512).sum(), c

    gm = _graph(fn, 1 << 18)
    cold = _by_name(gm, cold_read_bytes(gm.graph, int(2.5 * MIB)))
    final = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.add.Tensor][-1]
    # since b's write: ones (1 MiB) and c (1 MiB) and sum's 4-byte output: b (1 MiB) fits only partly in 2.5 MiB
    assert cold[final.name] == pytest.approx(2 * MIB + 4 + MIB - 2.5 * MIB)
    assert not any(n.op == "call_function" and "view" in str(n.target) for n in gm.graph.nodes if n.name in cold)


def test_bad_cache_size_names_the_fix():
    gm = _graph(_evicting, 16, 16)
    with pytest.raises(ValueError, match="cache_mib"):
        cold_read_bytes(gm.graph, 0)


def test_annotate_prices_cold_reads_at_the_memory_rate_only_on_a_device_with_a_cache():
    cpu = BUILTIN_DEVICES["cpu"]
    assert cpu.cache_mib == 0  # the built-in profile models no cache: its prices do not move
    cached = dataclasses.replace(
        cpu, cache_mib=2.0, cache_bandwidth_gbs=100.0, op_bandwidth_gbs={"pointwise": 100.0}, calibrated=True
    )
    gm = _graph(_evicting, 1024, 1024)

    annotate(gm, cpu)
    assert all(n.meta["cost"].cold_bytes == 0 for n in gm.graph.nodes if "cost" in n.meta)

    annotate(gm, cached)
    costs = {n.name: n.meta["cost"] for n in gm.graph.nodes if "cost" in n.meta}
    hot, cold = costs["mul"], costs["add_2"]  # the same bytes, a resident input against an evicted one
    assert hot.cold_bytes == 0 and cold.cold_bytes == 4 * KIB
    memory_rate = cached.hbm_bandwidth_gbs * 1e9 * cached.memory_efficiency
    hot_time = cached.op_time(str(cold.op), "pointwise", cold.flops, cold.bytes)
    assert cold.time_s > hot_time
    assert cold.time_s == pytest.approx(
        cached.op_time(str(cold.op), "pointwise", cold.flops, cold.bytes, cold_bytes=4 * KIB)
    )
    assert cold.time_s - hot_time <= 4 * KIB / memory_rate + 1e-12


def test_a_gemm_packs_its_cold_operands_at_the_memory_rate_before_its_arithmetic():
    cached = dataclasses.replace(BUILTIN_DEVICES["cpu"], cache_mib=2.0, cache_bandwidth_gbs=100.0, calibrated=True)
    m = n = k = 256
    hot = cached.gemm_time(m, n, k, "fp32")
    weight = k * n * 4.0
    cold = cached.gemm_time_cold(m, n, k, "fp32", 1, weight)
    packing = weight / (cached.hbm_bandwidth_gbs * 1e9 * cached.memory_efficiency) - weight / 100e9
    assert cold == pytest.approx(hot + packing)
    assert cached.gemm_time_cold(m, n, k, "fp32", 1, 0.0) == hot
    # a GEMM bound by its traffic already reads everything at the memory's rate: nothing is added
    fast = dataclasses.replace(cached, peak_tflops={"fp32": 1000.0})
    assert fast.gemm_time(1, 4096, 4096, "fp32") == pytest.approx(
        fast.gemm_launch_s("fp32")
        + (4096 * 4096 + 2 * 4096) * 4.0 / (fast.hbm_bandwidth_gbs * 1e9 * fast.memory_efficiency)
        - 4096 * 2.0 / (fast.hbm_bandwidth_gbs * 1e9 * fast.memory_efficiency)
    )  # memory bound
    assert fast.gemm_time_cold(1, 4096, 4096, "fp32", 1, 4096 * 4096 * 4.0) == fast.gemm_time(1, 4096, 4096, "fp32")

    gm = _graph(lambda x, w: x.view(256, 256) @ w.view(256, 256), 256 * 256, 256 * 256)
    annotate(gm, cached)
    (mm,) = [n.meta["cost"] for n in gm.graph.nodes if "cost" in n.meta and n.meta["cost"].op == "aten.mm"]
    assert mm.cold_bytes == 2 * weight  # both operands are graph inputs
    assert mm.time_s == pytest.approx(cached.gemm_time_cold(m, n, k, "fp32", 1, 2 * weight))


def test_the_expert_ops_are_calibrated_beside_their_modelled_gemms_and_priced_that_way():
    """`measure_expert_ops` measures the three expert-parallel experts ops at two row counts and keeps what the
    calls take beyond the GEMM model's grouped GEMMs as a fixed cost plus a rate over their row bytes; annotate
    prices a traced op as those GEMMs plus that line (the weights' bytes stay the GEMMs')."""
    from trex.cost_model.annotate import annotate_node, expert_gemm_seconds, expert_row_bytes
    from trex.cost_model.calibrate import _expert_op_calls, measure_expert_ops, traced_call
    from trex.cost_model.catalog import get_cluster

    cpu = BUILTIN_DEVICES["cpu"]
    measured = measure_expert_ops(cpu, repeats=1)
    assert set(measured) == {
        "trex.ep_experts_local",
        "trex.ep_experts_local_input_backward",
        "trex.ep_experts_local_weight_backward",
    }
    assert all(fixed >= cpu.kernel_overhead_s and rate > 0 for fixed, rate in measured.values())

    profile = dataclasses.replace(
        cpu,
        op_overhead_us={k: fixed * 1e6 for k, (fixed, _) in measured.items()},
        op_bandwidth_gbs={k: rate / 1e9 for k, (_, rate) in measured.items()},
    )
    node = traced_call(*_expert_op_calls(16)["trex.ep_experts_local"])
    cluster = get_cluster("cpu").with_device(profile)
    cost = annotate_node(node, cluster)
    rows = expert_row_bytes(cost.op, _values(node), cost.bytes)
    gemms = expert_gemm_seconds(cost.op, _values(node), profile, "fp32")
    fixed, rate = measured[cost.op]
    assert 0 < rows < cost.bytes  # the weights are left to the GEMMs
    assert cost.time_s == pytest.approx(gemms + profile.op_time(cost.op, "moe", 0.0, rows))
    assert cost.time_s >= gemms + fixed + rows / rate - 1e-12


def _values(node):
    from trex.cost_model.op_formulas import formula_for

    return formula_for(node.target).bind(node)
