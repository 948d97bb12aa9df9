"""Least-squares step-latency fits: exact on data of the model's form, non-negative, checked on held-out batches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trex.cost_model.model_spec import get_model_spec
from trex.workloads.serving.cluster_spec import cluster_from_dict
from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.instance_model import InstanceModel
from trex.workloads.serving.latency_fit import (
    LatencyModel,
    StepSample,
    fit_latency,
    holdout_error,
    load_latency_model,
    non_negative_lstsq,
    sample_instance,
    save_samples,
)
from trex.workloads.serving.profiling import FAST_GRID, profile_instance
from trex.workloads.serving.worker import WorkerModelConfig


def synthetic(model: LatencyModel) -> list[StepSample]:
    samples = []
    for batch in (1, 2, 4, 8):
        for length in (64, 256, 1024):
            samples.append(
                StepSample(
                    "prefill",
                    batch,
                    batch * length,
                    batch * length**2,
                    0,
                    model.prefill_s(batch * length, batch * length**2),
                )
            )
            samples.append(StepSample("decode", batch, batch, 0, batch * length, model.decode_s(batch, batch * length)))
    return samples


def test_fit_recovers_the_coefficients_of_noise_free_samples():
    truth = LatencyModel((0.004, 2e-5, 3e-9), (0.010, 1e-4, 5e-8), decode_multi=0.002)
    fitted = fit_latency(synthetic(truth))
    assert fitted.prefill == pytest.approx(truth.prefill, rel=1e-6)
    assert fitted.decode == pytest.approx(truth.decode, rel=1e-6)
    assert fitted.decode_multi == pytest.approx(0.002, rel=1e-6)
    assert truth.decode_s(2, 10) - truth.decode_s(1, 10) == pytest.approx(1e-4 + 0.002)


def test_gemv_to_gemm_step_is_left_out_when_the_samples_cannot_show_it():
    truth = LatencyModel((0.004, 2e-5, 3e-9), (0.010, 1e-4, 5e-8), decode_multi=0.002)
    several = [s for s in synthetic(truth) if s.seqs >= 2]
    assert fit_latency(several).decode_multi == 0.0


def test_fit_never_returns_negative_costs():
    rng = np.random.default_rng(0)
    features = np.column_stack([np.ones(20), rng.uniform(1, 100, 20)])
    target = 5.0 - 0.01 * features[:, 1]  # a negative slope is what plain least squares would give
    coef = non_negative_lstsq(features, target)
    assert (coef >= 0).all()


def test_fit_needs_enough_distinct_samples():
    with pytest.raises(ServingError, match="at least 3 distinct prefill samples"):
        fit_latency([StepSample("prefill", 1, 10, 100, 0, 0.01), StepSample("decode", 1, 1, 0, 10, 0.01)])


def test_fit_to_the_cost_model_predicts_held_out_batches():
    m = cluster_from_dict({"machines": [{"device": "h100", "count": 8}]}).machines[0]
    samples = sample_instance(InstanceModel(get_model_spec("llama3-70b"), m, tp=4))
    seen = [s for s in samples if s.seqs not in (2, 32)]
    held_out = [s for s in samples if s.seqs in (2, 32)]
    check = holdout_error(fit_latency(seen), held_out)
    assert check.samples == len(held_out) > 0
    assert check.max_error < 0.25  # the analytic roofline is not linear; the fit stays close


def test_profile_file_round_trips_and_bad_files_are_named(tmp_path):
    truth = LatencyModel((0.004, 2e-5, 3e-9), (0.010, 1e-4, 5e-8))
    path = save_samples(synthetic(truth), truth, tmp_path / "p.json")
    assert load_latency_model(path).decode == truth.decode
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"latency_model": {"prefill": [1, 2], "decode": [1, 2, 3]}}))
    with pytest.raises(ServingError, match="three finite non-negative numbers"):
        load_latency_model(bad)
    bad.write_text(json.dumps({"prefill": [1, 2, 3], "decode": [1, 2, 3], "decode_multi": -1}))
    with pytest.raises(ServingError, match="decode_multi"):
        load_latency_model(bad)
    with pytest.raises(ServingError, match="does not exist"):
        load_latency_model(tmp_path / "missing.json")
    bad.write_text(json.dumps({"prefill": [1, 2, 3], "decode": [1, 2, 3], "repack": [0.001]}))
    with pytest.raises(ServingError, match="repack"):
        load_latency_model(bad)


def test_repack_cost_is_fitted_from_repack_samples_and_round_trips(tmp_path):
    truth = LatencyModel((0.004, 2e-5, 3e-9), (0.010, 1e-4, 5e-8), repack=(0.002, 6e-5))
    repacks = [StepSample("repack", b, 0, 0, b * c, truth.repack_s(b * c)) for b in (1, 4, 8) for c in (16, 64)]
    fitted = fit_latency(synthetic(truth) + repacks)
    assert fitted.repack == pytest.approx(truth.repack, rel=1e-6)
    assert fit_latency(synthetic(truth)).repack == (0.0, 0.0)  # no repack samples: nothing to charge
    path = save_samples(repacks, fitted, tmp_path / "p.json")
    assert load_latency_model(path).repack == pytest.approx(truth.repack, rel=1e-6)
    assert fitted.repack_s(0) == 0.0 and fitted.predict(repacks[-1]) == pytest.approx(repacks[-1].seconds)


def test_profile_measures_a_real_cpu_instance_and_reports_held_out_error():
    grid = FAST_GRID.__class__(
        prompt_lengths=(8, 16, 24, 32),
        held_out_prompts=(16,),
        decode_contexts=(16, 48),
        decode_batches=(1, 2, 3, 4),
        fit_batches=(1, 3, 4),
        repeats=1,
        warmup=1,
    )
    result = profile_instance(
        WorkerModelConfig(layers=1, hidden=32, heads=2, vocab=64), threads=1, grid=grid, max_num_seqs=4
    )
    assert result.clock == "cpu"
    assert {(s.kind, s.seqs) for s in result.held_out} == {("prefill", 1), ("decode", 2)}
    assert [s.tokens for s in result.held_out if s.kind == "prefill"] == [16]
    assert result.limits.max_num_seqs == 4 and result.limits.max_prefill_seqs == 1
    with pytest.raises(ServingError, match="max-num-seqs"):
        profile_instance(
            WorkerModelConfig(layers=1, hidden=32, heads=2, vocab=64), threads=1, grid=grid, max_num_seqs=2
        )
    assert all(s.seconds > 0 for s in result.samples)
    assert all(c >= 0 for c in (*result.model.prefill, *result.model.decode, *result.model.repack))
    repacks = [s for s in result.samples if s.kind == "repack"]  # the engine's cache copy, timed for real
    assert len(repacks) == 8 and all(s not in result.held_out for s in repacks) and result.model.repack_s(200) > 0
    assert result.check.samples == len(result.held_out) and np.isfinite(result.check.max_error)
