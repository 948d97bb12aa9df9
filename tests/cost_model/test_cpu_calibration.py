"""`trex calibrate`: real measurements of this machine, saved as a profile that `cpu` then uses."""

import math

import pytest

from trex.cost_model.calibrate import calibrate, fit_line, save_calibration
from trex.cost_model.catalog import get_cluster
from trex.cost_model.devices import get_device, load_device_profile
from trex.cost_model.op_timing import ranks, spearman


@pytest.fixture(scope="module")
def measured():
    return calibrate(fast=True, threads=1)


def test_calibration_measures_every_microbenchmark(measured):
    assert {d for d, *_ in measured.matmul} == {"fp32", "bf16"}
    assert measured.copy and measured.pointwise and measured.attention
    assert {kind for kind, *_ in measured.collectives} >= {"all_reduce", "all_gather", "all_to_all"}
    assert {"pointwise", "softmax", "trex.moe_dispatch", "trex.grouped_mm"} <= set(measured.kinds)
    assert all(fixed > 0 and rate > 0 for fixed, rate in measured.kinds.values())


def test_the_fitted_gemm_model_reproduces_the_measured_matmuls(measured):
    profile = measured.profile
    for dtype, m, n, k, seconds in measured.matmul:
        predicted = profile.gemm_time(m, n, k, dtype, out_bytes=4.0 if dtype == "fp32" else 2.0)
        assert abs(math.log(predicted / seconds)) < math.log(4.0), (dtype, m, n, k, predicted, seconds)


def test_row_kernel_costs_are_measured(measured):
    rows = measured.rows
    assert rows.vector_lanes in (0, 4, 8, 16, 32, 64)  # where the softmax's scalar fallback ends, if it does
    if rows.vector_lanes:
        assert rows.scalar_softmax_ns["forward"] > 0 and measured.profile.vector_lanes == rows.vector_lanes
    assert set(rows.reduce_output_ns) == {"contiguous", "strided"}
    assert measured.profile.reduce_output_ns == rows.reduce_output_ns


def test_measured_quantities_are_physical(measured):
    profile, tier = measured.profile, measured.tier
    assert 1e9 < profile.peak_flops("fp32") < 1e13  # one core: GFLOP/s to a few TFLOP/s
    assert 0.5 < profile.hbm_bandwidth_gbs < 1000 and 0 < profile.memory_efficiency <= 1
    assert 0 < profile.kernel_overhead_us < 1000 and profile.calibrated
    assert 0 < tier.latency_us < 100_000 and tier.bandwidth_gbs > 0


def test_saved_profile_is_what_target_cpu_uses(measured, tmp_path, monkeypatch):
    monkeypatch.setenv("TREX_CACHE_DIR", str(tmp_path))
    path = save_calibration(measured)
    assert path == tmp_path / "cpu.toml"
    assert load_device_profile(path) == measured.profile
    assert get_device("cpu") == measured.profile
    assert get_cluster("cpu").tiers == (measured.tier,)
    assert get_cluster("cpu").cores == measured.cluster().cores >= 1

    assert "calibrated" not in " ".join(_cpu_estimate().notes)  # measured numbers: no warning


def _cpu_estimate():
    from trex.cost_model.model_spec import get_model_spec
    from trex.cost_model.parallel import ParallelConfig
    from trex.cost_model.step import estimate_step

    return estimate_step(get_model_spec("tiny-qwen3-moe"), get_cluster("cpu"), ParallelConfig(seq=32, gbs=2))


def test_estimates_on_an_uncalibrated_cpu_say_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TREX_CACHE_DIR", str(tmp_path))  # nothing saved there
    assert not get_device("cpu").calibrated
    assert any("not calibrated" in note and "trex calibrate" in note for note in _cpu_estimate().notes)


def test_skipping_the_collectives_keeps_the_measured_bandwidth_bound():
    result = calibrate(fast=True, collectives=False, threads=1)
    assert result.collectives == []
    copy_bandwidth = max(nbytes / seconds for nbytes, seconds in result.copy)
    assert result.tier.bandwidth_gbs == pytest.approx(copy_bandwidth / 1e9)
    assert "not measured" in result.tier.source


def test_the_gemm_fit_recovers_the_output_tile_of_synthetic_measurements(tmp_path, monkeypatch):
    # matmuls timed by a model with 16x16 tiles: the small and skinny shapes, which a 64x64 tile would
    # pad to a full tile, single out that tile. The rest of the model is the built-in (uncalibrated) cpu
    # profile, not a measurement, so the synthetic timings - and the test - do not depend on the load.
    import dataclasses

    from trex.cost_model.calibrate import _fit_gemm

    monkeypatch.setenv("TREX_CACHE_DIR", str(tmp_path))  # no saved calibration is read
    truth = get_device("cpu")
    truth = dataclasses.replace(truth, gemm=dataclasses.replace(truth.gemm, tile_m=16, tile_n=16, k_fill=16.0))
    shapes = [(64, 64, 64), (256, 256, 256), (1024, 1024, 256), (2, 64, 64), (4, 256, 64), (512, 4, 64), (24, 24, 256)]
    matmul = [("fp32", m, n, k, truth.gemm_time(m, n, k, "fp32", out_bytes=4.0)) for m, n, k in shapes]
    fitted = _fit_gemm(matmul, truth)
    assert (fitted.gemm.tile_m, fitted.gemm.tile_n) == (16, 16)
    for _, m, n, k, seconds in matmul:
        assert fitted.gemm_time(m, n, k, "fp32", out_bytes=4.0) == pytest.approx(seconds, rel=0.15)


def test_the_calibrated_tile_is_one_the_fit_offers(measured):
    from trex.cost_model.calibrate import _CPU_TILES

    assert (measured.profile.gemm.tile_m, measured.profile.gemm.tile_n) in _CPU_TILES


def test_fit_line_recovers_latency_and_bandwidth():
    intercept, slope = fit_line([(0.0, 5e-6), (1e6, 5e-6 + 1e-4), (4e6, 5e-6 + 4e-4)])
    assert intercept == pytest.approx(5e-6) and slope == pytest.approx(1e-10)


def test_spearman_on_hand_examples():
    assert ranks([10.0, 20.0, 20.0, 5.0]) == [2.0, 3.5, 3.5, 1.0]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_each_collective_kind_gets_its_own_measured_line(measured):
    from dataclasses import replace

    from trex.cost_model import collectives
    from trex.cost_model.cluster import MeasuredCollective

    kinds = {(m.kind, m.group) for m in measured.tier.collectives}
    assert kinds >= {("all_reduce", 2), ("all_gather", 2), ("reduce_scatter", 2), ("all_to_all", 2)}
    cluster = measured.cluster().sized(2)
    placement = cluster.strided_placement(2, 1)
    for m in measured.tier.collectives:
        assert m.latency_us > 0 and m.bandwidth_gbs > 0
        # a group of the measured size on that tier is priced by its kind's own line, not the ring formula
        assert collectives.collective_time(m.kind, 1e6, placement) == pytest.approx(m.seconds(1e6))
    # a group size that was not measured falls back to the alpha-beta formulas on the tier's latency and bandwidth
    bare = replace(measured.cluster(), tiers=(replace(measured.tier, collectives=()),))
    wider, wider_bare = (c.sized(8).strided_placement(8, 1) for c in (measured.cluster(), bare))
    assert collectives.all_reduce(1e6, wider) == collectives.all_reduce(1e6, wider_bare)
    # (the tier's own latency and bandwidth are fitted to the 2-rank all-reduce, so there the two agree by design;
    # a measured line is what prices its group, whatever it says)
    slow = MeasuredCollective("all_reduce", 2, 1e6, 1.0)
    marked = replace(bare, tiers=(replace(measured.tier, collectives=(slow,)),))
    assert collectives.all_reduce(1e6, marked.sized(2).strided_placement(2, 1)) == pytest.approx(slow.seconds(1e6))


def test_ranks_that_share_cores_time_share_them(measured):
    from dataclasses import replace

    cluster = replace(measured.cluster(), cores=2)
    assert cluster.sized(2).time_share == 1.0 and cluster.sized(4).time_share == 2.0
    assert get_cluster("h100", 8).time_share == 1.0  # a GPU is its own processor
