"""The activation model of the program a rank runs (`runtime.activation_model`) against the saved-tensor bytes the
runtime measures (`runtime.memory_accounting`), per family and precision: measured must equal predicted."""

from __future__ import annotations

import pytest
import torch

from trex.models import load_config
from trex.runtime.memory_accounting import SavedActivations
from trex.runtime.prediction import predict
from trex.runtime.trainer import TrainJob, execute


@pytest.mark.parametrize(
    "seq,gbs,mbs",
    [(16, 2, 2), (7, 2, 2), (3, 2, 1)],  # windows of both compressors; partial windows; no HCA window, one sequence
)
def test_deepseek_v4_activations_of_one_rank_equal_the_prediction(seq, gbs, mbs):
    job = TrainJob.create("tiny-deepseek-v4", "", 1, seq=seq, gbs=gbs, mbs=mbs, steps=1, verbose=False)
    predicted = predict(load_config("tiny-deepseek-v4"), job.parallel, 1)
    assert "deepseek_v4" in predicted["activation_model"], predicted["activation_model"]
    measured = execute(job)["memory_by_rank"][0]["activations"]
    assert measured == predicted["memory_bytes"]["activations"]


def test_a_branch_reaching_no_loss_is_not_counted():
    """An op that saves its own output (softmax) on a branch whose result only indexes (V4's lightning indexer)
    is freed with that branch when the forward ends; the measurement must not keep it alive itself."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def saved_bytes(with_dead_branch: bool) -> int:
        counter = SavedActivations(linear)
        with counter.counting():
            h = linear(x)
            if with_dead_branch:
                chosen = torch.softmax(h * 2.0, dim=-1).argmax(dim=-1)  # integer: reaches no loss
                h = h + chosen.unsqueeze(-1).to(h.dtype).detach()
            loss = h.square().sum()
        loss.backward()
        return counter.peak_bytes

    assert saved_bytes(True) == saved_bytes(False) > 0


@pytest.mark.parametrize("family", ["tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-deepseek-v4"])
def test_every_family_falls_back_only_where_it_says(family):
    """fp32 is described for every family at tp=1; what is not described says why (no silent fallback)."""
    config = load_config(family)
    fp32 = TrainJob.create(family, "ep=2", 2, seq=16, gbs=2, mbs=1, steps=1, verbose=False).parallel
    assert not predict(config, fp32, 2)["activation_model"].startswith("production-kernel formula")


def test_activations_on_two_ranks_equal_the_prediction_per_family_and_precision():
    """One start of 2 gloo ranks: every family in fp32 (ep=2, and V4 under ZeRO-1) and the bf16 descriptions.
    One micro-batch per rank: under ep the ranks together receive what they send, so the mean is exact."""
    from trex.runtime.launcher import launch_function, run_jobs

    cases = [
        ("tiny-qwen3-moe", "ep=2", "fp32"),
        ("tiny-qwen3-moe", "zero=3", "bf16"),
        ("tiny-deepseek-v3", "ep=2", "fp32"),
        ("tiny-deepseek-v3", "zero=1", "bf16"),
        ("tiny-deepseek-v4", "ep=2", "fp32"),
        ("tiny-deepseek-v4", "zero=1", "fp32"),
    ]
    jobs = [
        TrainJob.create(model, plan, 2, seq=16, gbs=2, mbs=1, steps=1, precision=precision, verbose=False)
        for model, plan, precision in cases
    ]
    results = launch_function(run_jobs, (jobs,), 2)[0]
    for case, job, result in zip(cases, jobs, results):
        predicted = predict(load_config(case[0]), job.parallel, 2)
        assert not predicted["activation_model"].startswith("production-kernel formula"), case
        measured = [m["activations"] for m in result["memory_by_rank"]]
        assert sum(measured) / len(measured) == predicted["memory_bytes"]["activations"], (case, measured)
