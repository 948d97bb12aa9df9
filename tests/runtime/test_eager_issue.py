"""An eager CPU rank's issue cost: the ops it issues are counted on its own program (plain vs DTensor ops, FSDP2
unit passes), `trex calibrate` measures what each costs on the host, and the step estimate adds counts x costs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trex.cost_model.catalog import get_cluster
from trex.cost_model.devices import load_device_profile
from trex.cost_model.eager_issue import IssueCounts, issue_seconds
from trex.cost_model.eager_issue_measure import IssuedOps, measure_eager_costs_apart
from trex.cost_model.model_spec import spec_from_config
from trex.cost_model.step import estimate_step
from trex.models import load_config
from trex.runtime.issued_ops import count_issued
from trex.runtime.trainer import TrainJob

MODEL = "tiny-qwen3-moe"
SHAPE = {"seq": 16, "gbs": 8, "mbs": 2}


def plan_of(text: str, nproc: int = 2):
    return TrainJob.create(MODEL, text, nproc, **SHAPE, steps=1, verbose=False).parallel


def test_the_mode_counts_top_level_ops_and_a_dtensor_op_once():
    x = torch.rand(4, 4, requires_grad=True)
    with IssuedOps() as mode:
        y = (x * 2).sum()
        y.backward()
    assert mode.dtensor == 0
    # mul, sum, then the backward: ones_like (the seed), sum's expand, mul's grad and accumulation into .grad
    assert mode.plain >= 4
    plain = mode.plain
    with IssuedOps() as again:
        (x * 2).sum().backward()
    assert again.plain == plain  # the same program issues the same ops


def test_issue_cost_is_counts_times_the_measured_costs():
    device = dataclasses.replace(get_cluster("cpu").device, eager_op_us=2.0, dtensor_op_us=100.0, fsdp_unit_us=500.0)
    counts = IssueCounts(plain_ops=1000, dtensor_ops=10, fsdp_unit_passes=3)
    # every op pays the eager cost; a DTensor op its extra; each FSDP2 unit pass its hooks
    assert issue_seconds(counts, device) == pytest.approx((1010 * 2.0 + 10 * 100.0 + 3 * 500.0) * 1e-6)
    assert issue_seconds(counts, get_cluster("cpu").device) == 0.0  # not measured: nothing priced


def test_the_step_pays_the_issue_cost_times_the_core_share():
    spec = spec_from_config(load_config(MODEL), MODEL)
    base = get_cluster("cpu")
    device = dataclasses.replace(base.device, eager_op_us=2.0, dtensor_op_us=100.0, fsdp_unit_us=500.0)
    cluster = dataclasses.replace(base.with_device(device), cores=2).sized(4)
    plan = plan_of("tp=2", nproc=4)
    without = estimate_step(spec, cluster, plan)
    counts = IssueCounts(3000, 1000, 0)
    with_counts = estimate_step(spec, cluster, dataclasses.replace(plan, issued_ops=(3000, 1000, 0)))
    expected = cluster.time_share * issue_seconds(counts, device)
    assert with_counts.breakdown.eager_issue_s == pytest.approx(expected)
    assert with_counts.step_time_s == pytest.approx(without.step_time_s + expected)


def test_counts_are_taken_on_the_ranks_own_program():
    """Rank 0 of each plan, built by the runtime's trainer on a fake group of 2 ranks, counted over one step."""
    config = load_config(MODEL)
    layers = config.num_hidden_layers
    dp = count_issued(config, plan_of("zero=0"), 2)
    tp = count_issued(config, plan_of("tp=2"), 2)
    fsdp = count_issued(config, plan_of("zero=3"), 2)
    for counts in (dp, tp, fsdp):
        assert isinstance(counts, IssueCounts), counts
    # data parallelism over plain tensors issues no DTensor op and no FSDP2 hook
    assert dp.dtensor_ops == 0 and dp.fsdp_unit_passes == 0 and dp.plain_ops > 0
    # the tensor-parallel styles make DTensors of the sharded weights and the sequence-parallel activations
    assert tp.dtensor_ops > 0 and tp.fsdp_unit_passes == 0
    # FSDP2: one unit per decoder layer and the root, each passed once per micro-batch; its optimizer steps DTensors
    microbatches = plan_of("zero=3").microbatches
    assert fsdp.fsdp_unit_passes == (layers + 1) * microbatches
    assert fsdp.dtensor_ops > 0
    # the counts are remembered: the same plan is not run again
    assert count_issued(config, plan_of("tp=2"), 2) is tp


def test_the_calibration_measures_the_three_issue_costs_and_the_profile_keeps_them(tmp_path):
    measured = measure_eager_costs_apart(repeats=1)
    assert "error" not in measured, measured
    for key in ("eager_op_us", "dtensor_op_us", "fsdp_unit_us"):
        assert measured[key] >= 0.0, (key, measured)
    # the tp block issues DTensor ops; FSDP2's units issue more plain ops than the same blocks unsharded
    assert measured["tp_block_ops"][1] > 0
    assert measured["fsdp_ops"][0] > measured["unsharded_ops"]
    # a DTensor op costs more than a plain one (sharding propagation, wrapping): the fit is not degenerate
    assert measured["dtensor_op_us"] > measured["eager_op_us"]
    path = tmp_path / "cpu.toml"
    base = get_cluster("cpu").device
    profile = dataclasses.replace(
        base,
        eager_op_us=measured["eager_op_us"],
        dtensor_op_us=measured["dtensor_op_us"],
        fsdp_unit_us=measured["fsdp_unit_us"],
    )
    from trex.cost_model.devices import device_profile_to_dict
    from trex.cost_model.toml_writer import dumps

    path.write_text(dumps(device_profile_to_dict(profile)))
    loaded = load_device_profile(path)
    assert (loaded.eager_op_us, loaded.dtensor_op_us, loaded.fsdp_unit_us) == pytest.approx(
        (profile.eager_op_us, profile.dtensor_op_us, profile.fsdp_unit_us)
    )


def _dies_without_answering() -> dict:
    import os

    os._exit(3)


def _raises() -> dict:
    raise ValueError("no fake group here")


def test_a_spawned_measurement_that_dies_or_raises_is_reported_not_waited_out():
    import time

    from trex.cost_model.eager_issue_measure import answer_apart

    timeout_s = 300.0
    start = time.monotonic()
    assert answer_apart(_dies_without_answering, (), timeout_s) is None
    assert time.monotonic() - start < timeout_s  # the dead process was noticed, not waited out to the timeout
    assert answer_apart(_raises, (), timeout_s) == {"error": "ValueError: no fake group here"}
