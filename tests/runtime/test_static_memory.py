"""Parameters, gradients and optimizer states: what the ranks hold (from the tensors) equals the cost model's
arithmetic for every family x precision, because both read one dtype layout (`runtime.training_layout`: fp32
parameters, gradients and states, compute in --precision under autocast).

torch.chunk splits an odd-sized tensor unevenly over the ranks (ZeRO shards, FSDP2), so one rank may hold a few
elements more than another; the prediction is the mean over the ranks, which must equal the measurement to the
byte, and each rank is within those few elements of it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trex.cost_model.memory import ParamCounts, static_memory
from trex.errors import TrexError
from trex.models import build_model, load_config
from trex.runtime.prediction import predict
from trex.runtime.trainer import TrainJob
from trex.runtime.training_layout import check_layout

PARTS = ("parameters", "gradients", "optimizer_states")
SHAPE = {"seq": 8, "gbs": 2, "mbs": 1}


def _two_rank_static(cases: list[tuple[str, str, str]], nproc: int = 2, extra: list | None = None) -> list[dict]:
    """One start of `nproc` gloo ranks running `cases` (model, plan, precision) for one step each, then the
    `extra` jobs (their results are returned, rank 0's)."""
    from trex.runtime.launcher import launch_function, run_jobs

    jobs = [
        TrainJob.create(model, plan, nproc, **SHAPE, steps=1, precision=precision, verbose=False)
        for model, plan, precision in cases
    ]
    results = launch_function(run_jobs, (jobs + list(extra or []),), nproc)[0]
    for case, job, result in zip(cases, jobs, results):
        predicted = predict(load_config(case[0]), job.parallel, nproc)["memory_bytes"]
        ranks = result["memory_by_rank"]
        for part in PARTS:
            measured = [m[part] for m in ranks]
            assert sum(measured) / len(measured) == predicted[part], (case, part, measured, predicted[part])
            assert max(abs(m - predicted[part]) for m in measured) <= 1e-3 * predicted[part], (case, part, measured)
    return results[len(jobs) :]


def test_static_memory_on_two_ranks_equals_the_prediction_per_family_and_precision():
    """Each family in fp32 and bf16, each under a plan that shards something different (ZeRO-1 states, ZeRO-2
    gradients, ZeRO-3 everything incl. parameters no gradient reaches - V4's indexer -, ep experts, tp heads)."""
    _two_rank_static(
        [
            ("tiny-qwen3-moe", "zero=2", "fp32"),
            ("tiny-qwen3-moe", "zero=1", "bf16"),
            ("tiny-deepseek-v3", "ep=2", "fp32"),
            ("tiny-deepseek-v3", "zero=3", "bf16"),
            ("tiny-deepseek-v4", "zero=3", "fp32"),
            ("tiny-deepseek-v4", "tp=2", "bf16"),
        ]
    )


@pytest.mark.slow  # 2 gloo ranks, 12 runs (~5 min on the loaded 2-core machine)
def test_static_memory_on_two_ranks_more_plans():
    _two_rank_static(
        [
            (model, plan, precision)
            for model in ("tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-deepseek-v4")
            for plan, precision in (("zero=0", "bf16"), ("ep=2,zero=3", "fp32"), ("tp=2,zero=3", "bf16"))
        ]
        + [("tiny-deepseek-v4", "zero=2", "bf16"), ("tiny-deepseek-v4", "tp=2", "fp32")]
    )


def test_zero_shards_a_tensor_whose_only_dim_tp_splits():
    """V4's attention sinks are 1-D and split with their heads over tp: ZeRO-1/2 split this rank's shard again
    over the dp replicas (a strided shard of the whole tensor) rather than keep it whole on every replica, which
    the cost model - sharding every dense parameter over dp - would not price."""
    from torch.distributed.tensor import Replicate, Shard

    from trex.runtime.data_parallel import zero_shard_dim

    assert zero_shard_dim(torch.Size([8]), (Replicate(), Shard(0))) == 0
    assert zero_shard_dim(torch.Size([8, 4]), (Replicate(), Shard(0))) == 1  # a free dim first
    assert zero_shard_dim(torch.Size([8]), (Replicate(), Replicate())) == 0
    assert zero_shard_dim(torch.Size([]), (Replicate(),)) is None


@pytest.mark.slow  # 4 gloo ranks (~4 min on the loaded 2-core machine)
def test_static_memory_on_four_ranks_with_tp_and_dp(tmp_path):
    """tp=2 x dp=2 under ZeRO-1 and ZeRO-2: the tp-split sinks are ZeRO-sharded over dp like every dense
    parameter (was +32 B and +48 B per rank, mean over ranks, before). The ZeRO-2 run's checkpoint - sinks' states
    saved as strided shards - resumes under ZeRO-1 on the same ranks, and then on one rank, exactly."""
    from trex.runtime.trainer import execute

    model = "tiny-deepseek-v4"
    ref = execute(TrainJob.create(model, "", 1, **SHAPE, steps=3, verbose=False))
    directory = str(tmp_path / "ckpt")
    save = TrainJob.create(
        model, "tp=2,zero=2", 4, **SHAPE, steps=1, checkpoint_dir=directory, save_every=1, verbose=False
    )
    resume = TrainJob.create(
        model, "tp=2,zero=1", 4, **SHAPE, steps=2, checkpoint_dir=directory, resume=True, save_every=1, verbose=False
    )
    saved, resumed = _two_rank_static(
        [(model, "tp=2", "fp32"), (model, "tp=2,zero=2", "fp32")], nproc=4, extra=[save, resume]
    )
    assert saved["losses"] == pytest.approx(ref["losses"][:1], rel=1e-5)
    assert resumed["first_step"] == 1
    assert resumed["losses"] == pytest.approx(ref["losses"][1:2], rel=1e-5)
    last = execute(
        TrainJob.create(model, "", 1, **SHAPE, steps=3, checkpoint_dir=directory, resume=True, verbose=False)
    )
    assert last["first_step"] == 2
    assert last["losses"] == pytest.approx(ref["losses"][2:], rel=1e-5)


def test_the_resolved_plan_names_the_runtime_layout_and_bf16_prices_no_master_copy():
    """bf16 under autocast holds what fp32 holds (fp32 parameters stepped directly); the production layout
    (bf16 weights + fp32 master) is priced differently, and the trainer refuses a plan that names it."""
    config = load_config("tiny-qwen3-moe")
    fp32 = TrainJob.create("tiny-qwen3-moe", "zero=1", 2, **SHAPE, steps=1, precision="fp32").parallel
    bf16 = TrainJob.create("tiny-qwen3-moe", "zero=1", 2, **SHAPE, steps=1, precision="bf16").parallel
    assert bf16.param_dtype == bf16.grad_dtype == bf16.optimizer_state_dtype == "fp32"
    static = {
        name: [predict(config, plan, 2)["memory_bytes"][part] for part in PARTS]
        for name, plan in (("fp32", fp32), ("bf16", bf16))
    }
    assert static["bf16"] == static["fp32"]
    production = dataclasses.replace(bf16, param_dtype=None)
    weights, _, states = (predict(config, production, 2)["memory_bytes"][part] for part in PARTS)
    assert weights == static["bf16"][0] / 2  # bf16 weights
    assert states == static["bf16"][2] * 1.5  # an fp32 master copy beside AdamW's two moments, sharded alike
    model = build_model(config, device="meta")
    check_layout(model, bf16)
    with pytest.raises(TrexError, match="dtype layout"):
        check_layout(model, production)
    with pytest.raises(TrexError, match="not stored in fp32"):
        check_layout(model.to(torch.bfloat16), bf16)


def test_static_memory_of_fp32_parameters_has_no_master_copy():
    params = ParamCounts(dense=1000.0, expert=3000.0)
    common = {"dp": 2, "edp": 4, "grad_dtype": "fp32", "state_dtype": "fp32", "muon": False}
    autocast = static_memory(params, zero=1, precision="bf16", param_dtype="fp32", **common)
    assert autocast == static_memory(params, zero=1, precision="fp32", **common)
    assert autocast == (4 * 4000.0, 4 * 4000.0, 8 * (1000.0 / 2 + 3000.0 / 4))
    mixed = static_memory(params, zero=1, precision="bf16", **common)
    assert mixed == (2 * 4000.0, 4 * 4000.0, 12 * (1000.0 / 2 + 3000.0 / 4))
