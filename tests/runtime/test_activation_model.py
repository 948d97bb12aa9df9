"""The activation model of the program a rank runs (`runtime.activation_model`) against the saved-tensor bytes the
runtime measures (`runtime.memory_accounting`), per family and precision: measured must equal predicted."""

from __future__ import annotations

import pytest
import torch

from trex.models import load_config
from trex.runtime.memory_accounting import SavedActivations
from trex.runtime.prediction import predict
from trex.runtime.trainer import TrainJob, execute


def _one_rank(model: str, seq: int, gbs: int, mbs: int, precision: str) -> tuple[int, dict]:
    job = TrainJob.create(model, "", 1, seq=seq, gbs=gbs, mbs=mbs, steps=1, precision=precision, verbose=False)
    predicted = predict(load_config(model), job.parallel, 1)
    return execute(job)["memory_by_rank"][0]["activations"], predicted


@pytest.mark.parametrize(
    "seq,gbs,mbs,precision",
    [
        (16, 2, 2, "fp32"),  # windows of both compressors
        (7, 2, 2, "fp32"),  # partial windows
        (3, 2, 1, "fp32"),  # no HCA window, one sequence
        (16, 2, 2, "bf16"),
        (3, 2, 1, "bf16"),  # bf16 with no HCA window: its compressor's Linears (and their bf16 copies) are dead
    ],
)
def test_deepseek_v4_activations_of_one_rank_equal_the_prediction(seq, gbs, mbs, precision):
    measured, predicted = _one_rank("tiny-deepseek-v4", seq, gbs, mbs, precision)
    assert "deepseek_v4" in predicted["activation_model"], predicted["activation_model"]
    assert precision.replace("bf16", "bf16 autocast") in predicted["activation_model"]
    assert measured == predicted["memory_bytes"]["activations"]


@pytest.mark.slow  # two more shapes of V4 in bf16 (~1 min on the loaded machine)
@pytest.mark.parametrize("seq,gbs,mbs", [(12, 3, 3), (7, 2, 2)])
def test_deepseek_v4_bf16_activations_at_more_shapes(seq, gbs, mbs):
    measured, predicted = _one_rank("tiny-deepseek-v4", seq, gbs, mbs, "bf16")
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
    """Every family is described in fp32 and bf16, under ep and under tp; a compiled rank (the partitioner chooses
    what it saves) falls back to the production-kernel formula and says why."""
    config = load_config(family)
    for plan in ("ep=2", "tp=2"):
        for precision in ("fp32", "bf16"):
            job = TrainJob.create(family, plan, 2, seq=16, gbs=2, mbs=1, steps=1, precision=precision, verbose=False)
            described = predict(config, job.parallel, 2)["activation_model"]
            assert not described.startswith("production-kernel formula"), (plan, precision, described)
    compiled = predict(config, job.parallel, 2, compiled=True)["activation_model"]
    assert compiled.startswith("production-kernel formula") and "compiled" in compiled, compiled


def _two_ranks(cases: list[tuple[str, str, str]], mbs: int = 1, gbs: int = 2) -> None:
    """One start of 2 gloo ranks for `cases` (model, plan, precision); the mean over the ranks must equal the
    prediction byte for byte (under ep the ranks together receive what they send in each micro-batch)."""
    from trex.runtime.launcher import launch_function, run_jobs

    jobs = [
        TrainJob.create(model, plan, 2, seq=16, gbs=gbs, mbs=mbs, steps=1, precision=precision, verbose=False)
        for model, plan, precision in cases
    ]
    results = launch_function(run_jobs, (jobs,), 2)[0]
    for case, job, result in zip(cases, jobs, results):
        predicted = predict(load_config(case[0]), job.parallel, 2)
        assert not predicted["activation_model"].startswith("production-kernel formula"), case
        measured = [m["activations"] for m in result["memory_by_rank"]]
        assert sum(measured) / len(measured) == predicted["memory_bytes"]["activations"], (case, measured)


def test_activations_on_two_ranks_equal_the_prediction_per_family_and_precision():
    """One start of 2 gloo ranks, one micro-batch per rank: every family under ep and under tp, bf16 under tp for
    every family, DeepSeek-V4 in bf16."""
    _two_ranks(
        [
            ("tiny-qwen3-moe", "ep=2", "fp32"),
            ("tiny-qwen3-moe", "tp=2", "bf16"),
            ("tiny-deepseek-v3", "ep=2", "fp32"),
            ("tiny-deepseek-v3", "tp=2", "bf16"),
            ("tiny-deepseek-v4", "ep=2", "bf16"),
            ("tiny-deepseek-v4", "tp=2", "bf16"),
        ]
    )


@pytest.mark.slow  # 2 gloo ranks, 10 runs (~5 min on the loaded 2-core machine)
def test_activations_on_two_ranks_more_plans():
    """The rest of the family x precision x plan set on 2 ranks; two sequences per micro-batch under tp (the
    batched matmuls of V4's attention copy keys and values when a micro-batch holds more than one sequence)."""
    _two_ranks(
        [
            ("tiny-qwen3-moe", "zero=3", "bf16"),
            ("tiny-deepseek-v3", "zero=1", "bf16"),
            ("tiny-deepseek-v4", "zero=1", "fp32"),
            ("tiny-deepseek-v4", "zero=1", "bf16"),
            ("tiny-deepseek-v4", "tp=2", "fp32"),
        ]
    )
    _two_ranks(
        [
            ("tiny-qwen3-moe", "tp=2", "bf16"),
            ("tiny-deepseek-v3", "tp=2", "fp32"),
            ("tiny-deepseek-v3", "tp=2", "bf16"),
            ("tiny-deepseek-v4", "tp=2", "fp32"),
            ("tiny-deepseek-v4", "tp=2", "bf16"),
        ],
        mbs=2,
        gbs=4,
    )
