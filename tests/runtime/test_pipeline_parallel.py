"""Pipeline parallelism gives the losses and gradients of the 1-rank run, for every schedule, and
resumes a checkpoint saved under another pipeline layout.

Default run: one start of 2 gloo ranks runs tiny Qwen3-MoE with pp=2 under 1F1B, under ZB-V
(vpp=2, V placement, backward split into input and weight gradients) and under 1F1B with ZeRO-3 (each
chunk an FSDP2 root), and resumes under pp=2 (GPipe) a checkpoint the 1-rank run saved. Slow: all three families (DeepSeek-V4 with its hash-routed MoE
layer on the first stage) and all five schedules with pp=2 and pp=4 (8-layer models for pp=4 with two
chunks per stage), pp composed with ep, dp/ZeRO-1/2/3 (ZB-V and DualPipeV with ZeRO-3 too) and tp on 4 ranks
(all three families under tp, every schedule; DeepSeek-V3/V4 under tp x ep),
and pp=2 -> pp=4 / pp=1 resumes.
"""

from __future__ import annotations

import json
import math

import pytest

from trex.models import tiny_config
from trex.runtime.launcher import launch_function, run_jobs
from trex.runtime.trainer import TrainJob, execute

SHAPE = {"seq": 16, "gbs": 4, "mbs": 1}
STEPS = 2
LOSS_RTOL = 1e-5
GRAD_TOL = 1e-4


def job(model: str, plan: str, nproc: int, schedule: str = "", shape=None, **fields) -> TrainJob:
    return TrainJob.create(
        model, plan, nproc, **(shape or SHAPE), steps=fields.pop("steps", STEPS), schedule=schedule, verbose=False,
        **fields,
    )  # fmt: skip


def assert_same_run(result: dict, ref: dict, label: str) -> None:
    assert len(result["losses"]) == len(ref["losses"]), label
    for step, (got, want) in enumerate(zip(result["losses"], ref["losses"])):
        assert math.isclose(got, want, rel_tol=LOSS_RTOL), f"{label}: step {step} loss {got} vs 1-rank {want}"
    if ref.get("gradients") is None or result.get("gradients") is None:
        return
    grads, want_grads = result["gradients"], ref["gradients"]
    assert set(grads) == set(want_grads), f"{label}: gradient names differ: {sorted(set(grads) ^ set(want_grads))[:5]}"
    largest = max(g.abs().max().item() for g in want_grads.values())
    for name, want in want_grads.items():
        scale = max(want.abs().max().item(), 1e-2 * largest, 1e-12)
        error = (grads[name] - want).abs().max().item() / scale
        assert error <= GRAD_TOL, f"{label}: {name} gradient differs by {error:.2e} (relative to its max)"


def assert_cases_match_the_one_rank_run(model: str, cases: list[tuple[str, str]], nproc: int) -> None:
    """(plan, schedule) jobs on `nproc` ranks in one start: losses and gathered gradients equal the 1-rank run's,
    and each reports its bubble."""
    ref = execute(job(model, "", 1, gather_gradients=True))
    jobs = [job(model, plan, nproc, schedule, gather_gradients=True) for plan, schedule in cases]
    results = launch_function(run_jobs, (jobs,), nproc)
    for (plan, schedule), result in zip(cases, results[0]):
        assert_same_run(result, ref, f"{model} {plan} {schedule}")
        assert_bubble_report(result, schedule, f"{model} {plan} {schedule}")


def assert_bubble_report(result: dict, schedule: str, label: str) -> None:
    pipeline = result["pipeline"]
    assert pipeline["schedule"] == schedule, label
    bubble = pipeline["bubble_fraction"]
    assert 0.0 <= bubble["measured"] < 1.0, label
    assert 0.0 <= bubble["predicted"] < 1.0, label
    assert len(pipeline["layers_per_chunk"]) == pipeline["pp"] * pipeline["vpp"], label
    assert len(pipeline["measured"]["by_stage"]) == pipeline["pp"], label  # every stage measured
    # the runtime's own costs, measured by the calibration run of the same schedule over null chunks
    costs = pipeline["runtime_overheads"]
    assert costs["samples"] > 0 and costs["action_s"] > 0 and costs["p2p_s"] > 0, label
    assert costs["link_latency_us"] > 0, label
    # with them, the prediction has more idle time than the compute alone - when each stage has its own core;
    # stages that share cores (pipeline_cores < pp, e.g. pp=2 x tp=2 on 2 cores) run faster while another idles,
    # which fills part of the bubble, so then the two may come out either way
    if pipeline["pipeline_cores"] is None:
        assert bubble["predicted"] > bubble["predicted_compute_only"], label
    # the task times simulated: each chunk's own passes, timed alone (not under zero=3: FSDP2's hooks)
    calibrated = pipeline["calibrated_task_seconds"]
    if "zero=3" in label:
        assert calibrated is None and "zero=3" in pipeline["prediction_note"], label
        return
    chunks = len(pipeline["layers_per_chunk"])
    assert all(len(calibrated[kind]) == chunks and min(calibrated[kind]) > 0 for kind in ("F", "B", "W")), label
    assert 0 <= bubble["predicted_with_cost_model_tasks"] < 1, label
    if pipeline["placement"] == "v":  # the engine's split backward: no input pass on the first chunk
        assert calibrated["I"][0] == 0 and min(calibrated["I"][1:]) > 0, label


def test_pipeline_schedules_match_the_one_rank_run_and_resume_under_another_pipeline_layout(tmp_path):
    model = "tiny-qwen3-moe"
    ref = execute(job(model, "", 1, gather_gradients=True))
    execute(job(model, "", 1, steps=1, checkpoint_dir=str(tmp_path / "ckpt"), save_every=1))  # saved with pp=1
    cases = [("pp=2", "1f1b"), ("pp=2,vpp=2", "zbv"), ("pp=2,zero=3", "1f1b")]  # zero=3: FSDP2 chunk roots
    jobs = [job(model, plan, 2, schedule, gather_gradients=True) for plan, schedule in cases]
    jobs.append(job(model, "pp=2", 2, "gpipe", checkpoint_dir=str(tmp_path / "ckpt"), resume=True))
    # `--plan auto` prices pipeline layouts too: held to pp=2 it picks vpp, the split and ZeRO, and that runs
    jobs.append(job(model, "auto:pp=2", 2, gather_gradients=True))
    # the bubble bench's odd rounds: the prediction's calibration taken before the training steps leaves the
    # training run as it is (the chunks' gradients and the RNG restored)
    jobs.append(job(model, "pp=2,vpp=2", 2, "zbv", gather_gradients=True, calibrate_first=True))
    results = launch_function(run_jobs, (jobs,), 2)
    for (plan, schedule), result in zip(cases, results[0]):
        assert result["world_size"] == 2
        assert_same_run(result, ref, f"{model} {plan} {schedule}")
        assert_bubble_report(result, schedule, f"{plan} {schedule}")
    assert results[0][1]["pipeline"]["placement"] == "v"
    assert results[0][0]["pipeline"]["bubble_fraction"]["predicted_closed_form"] == pytest.approx(
        1 / 5
    )  # (p-1)/(m+p-1)
    resumed = results[0][3]
    assert resumed["first_step"] == 1
    assert resumed["losses"] == pytest.approx(ref["losses"][1:], rel=LOSS_RTOL)
    planned = results[0][4]
    assert planned["pipeline"]["pp"] == 2
    assert_same_run(planned, ref, f"{model} auto:pp=2 -> {planned['pipeline']['split']}")
    first = results[0][5]
    assert_same_run(first, ref, f"{model} pp=2,vpp=2 zbv, calibrated first")
    assert_bubble_report(first, "zbv", "pp=2,vpp=2 zbv, calibrated first")
    pipeline = first["pipeline"]
    assert pipeline["calibrated_first"] and pipeline["calibration_window_s"][1] <= pipeline["measured_window_s"][0]
    after = results[0][1]["pipeline"]  # the same plan calibrated after its steps
    assert not after["calibrated_first"] and after["measured_window_s"][1] <= after["calibration_window_s"][0]
    for a, b in zip(results[0], results[1]):  # every rank reports the same losses
        assert a["losses"] == b["losses"]


# -- slow: every family and schedule, pp=2 and pp=4, compositions, resumes -----------------------------------

FAMILIES = ["tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-deepseek-v4"]
TWO_STAGE_CASES = [
    ("pp=2", "gpipe"),
    ("pp=2", "1f1b"),
    ("pp=2,vpp=2", "interleaved"),
    ("pp=2,vpp=2", "zbv"),
    ("pp=2,vpp=2", "dualpipev"),
]


@pytest.mark.slow
@pytest.mark.parametrize("model", FAMILIES)
def test_every_schedule_with_two_stages_matches_the_one_rank_run(model):
    assert_cases_match_the_one_rank_run(model, TWO_STAGE_CASES, 2)


def eight_layer_config(tmp_path, family: str) -> str:
    """A tiny model with 8 layers (pp=4 with two chunks per stage), as a config.json --model path."""
    config = tiny_config(family, num_layers=8)
    path = tmp_path / f"{family}-8.json"
    path.write_text(json.dumps(config.to_dict()))
    return str(path)


FOUR_STAGE_CASES = [
    ("pp=4", "gpipe"),
    ("pp=4", "1f1b"),
    ("pp=4,vpp=2", "interleaved"),
    ("pp=4,vpp=2", "zbv"),
    ("pp=4,vpp=2", "dualpipev"),
]
FOUR_STAGE_SHAPE = {"seq": 16, "gbs": 8, "mbs": 1}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3-moe", "deepseek-v3", "deepseek-v4"])
def test_every_schedule_with_four_stages_matches_the_one_rank_run(tmp_path, family):
    model = eight_layer_config(tmp_path, family)
    ref = execute(job(model, "", 1, shape=FOUR_STAGE_SHAPE, gather_gradients=True))
    jobs = [job(model, p, 4, s, shape=FOUR_STAGE_SHAPE, gather_gradients=True) for p, s in FOUR_STAGE_CASES]
    results = launch_function(run_jobs, (jobs,), 4)
    for (plan, schedule), result in zip(FOUR_STAGE_CASES, results[0]):
        assert_same_run(result, ref, f"{family} {plan} {schedule}")
        assert_bubble_report(result, schedule, f"{family} {plan} {schedule}")


COMPOSED_CASES = [
    ("pp=2,ep=2", "1f1b"),
    ("pp=2,dp=2,zero=3", "1f1b"),
    ("pp=2,vpp=2,dp=2,zero=3", "interleaved"),
    ("pp=2,dp=2,zero=1", "1f1b"),
    ("pp=2,dp=2,zero=2", "gpipe"),
    ("pp=2,vpp=2,ep=2", "zbv"),
    ("pp=2,vpp=2,ep=2,zero=1", "interleaved"),
]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-qwen3-moe", "tiny-deepseek-v4"])
def test_pipeline_composes_with_expert_and_data_parallelism_on_four_ranks(model):
    ref = execute(job(model, "", 1, gather_gradients=True))
    jobs = [job(model, plan, 4, schedule, gather_gradients=True) for plan, schedule in COMPOSED_CASES]
    results = launch_function(run_jobs, (jobs,), 4)
    for (plan, schedule), result in zip(COMPOSED_CASES, results[0]):
        assert_same_run(result, ref, f"{model} {plan} {schedule}")
    memory = {plan: result["memory_by_rank"] for (plan, _), result in zip(COMPOSED_CASES, results[0])}
    # ZeRO-1 over dp=2 inside each stage halves that stage's optimizer state (torch.chunk's uneven split: 2%)
    plain = execute(job(model, "", 1))["memory_by_rank"][0]["optimizer_states"]
    stage_states = memory["pp=2,dp=2,zero=1"][0]["optimizer_states"] + memory["pp=2,dp=2,zero=1"][2]["optimizer_states"]
    assert stage_states == pytest.approx(plain / 2, rel=0.02)


TENSOR_PARALLEL_CASES = {
    "tiny-qwen3-moe": ["1f1b", "interleaved", "zbv", "dualpipev"],
    # head-parallel attention inside each stage; V4's hash-routed layer on chunk 0 routes this rank's token ids
    "tiny-deepseek-v3": ["gpipe", "1f1b", "interleaved", "zbv", "dualpipev"],
    "tiny-deepseek-v4": ["gpipe", "1f1b", "interleaved", "zbv", "dualpipev"],
}


def tensor_parallel_plan(schedule: str) -> str:
    """pp=2 x tp=2, with two chunks per stage for the interleaved and the V schedules."""
    return "pp=2,tp=2" if schedule in ("gpipe", "1f1b") else "pp=2,vpp=2,tp=2"


@pytest.mark.slow
@pytest.mark.parametrize("model", list(TENSOR_PARALLEL_CASES))
def test_pipeline_composes_with_tensor_parallelism_on_four_ranks(model):
    """pp=2 x tp=2: tp with sequence parallelism inside each stage (the chunk hands on its rank's sequence shard,
    the last chunk its vocabulary shard of the logits for the vocabulary-parallel loss) - Qwen3-MoE's DTensor
    styles, DeepSeek-V3/V4's head-parallel attention; losses and gathered gradients equal the 1-rank run's, and
    the bubble is reported as for any pipeline."""
    schedules = TENSOR_PARALLEL_CASES[model]
    ref = execute(job(model, "", 1, gather_gradients=True))
    jobs = [job(model, tensor_parallel_plan(schedule), 4, schedule, gather_gradients=True) for schedule in schedules]
    results = launch_function(run_jobs, (jobs,), 4)
    for schedule, result in zip(schedules, results[0]):
        label = f"{model} {tensor_parallel_plan(schedule)} {schedule}"
        assert_same_run(result, ref, label)
        assert_bubble_report(result, schedule, label)


HEAD_PARALLEL_EP_CASES = {
    "tiny-deepseek-v3": [("pp=2,tp=2,ep=2", "1f1b")],
    # the split backward (input, then weight gradients) through the expert-parallel exchange, and V4's hash-routed
    # layer on chunk 0 with its experts over the tp ranks
    "tiny-deepseek-v4": [
        ("pp=2,tp=2,ep=2", "1f1b"),
        ("pp=2,vpp=2,tp=2,ep=2", "zbv"),
        ("pp=2,vpp=2,tp=2,ep=2", "dualpipev"),
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("model", list(HEAD_PARALLEL_EP_CASES))
def test_head_parallel_stages_compose_with_expert_parallelism_on_four_ranks(model):
    """pp=2 x tp=2 x ep=2 for DeepSeek-V3/V4: head-parallel attention over the tp ranks of each stage and the
    routed experts over the same ranks (the expert mesh folds over dp x tp); losses and gathered gradients equal
    the 1-rank run's."""
    assert_cases_match_the_one_rank_run(model, HEAD_PARALLEL_EP_CASES[model], 4)


@pytest.mark.slow
def test_split_backward_schedules_with_zero3_shard_each_chunk_as_one_unit():
    """ZB-V and DualPipeV with ZeRO-3 over dp=2 inside each stage: each chunk is the only FSDP2 unit (a decoder
    layer sharded as its own unit loses its weight-pass gradients), and losses and gradients equal the 1-rank
    run's; with ep the combination is refused (test_pipeline_split)."""
    model, shape = "tiny-qwen3-moe", {**SHAPE, "gbs": 8}  # DualPipeV: 2*pp micro-batches per replica
    ref = execute(job(model, "", 1, shape=shape, gather_gradients=True))
    cases = [("pp=2,vpp=2,dp=2,zero=3", "zbv"), ("pp=2,vpp=2,dp=2,zero=3", "dualpipev")]
    jobs = [job(model, plan, 4, schedule, shape=shape, gather_gradients=True) for plan, schedule in cases]
    results = launch_function(run_jobs, (jobs,), 4)
    for (plan, schedule), result in zip(cases, results[0]):
        assert_same_run(result, ref, f"{model} {plan} {schedule}")


@pytest.mark.slow
def test_a_pipeline_checkpoint_resumes_under_other_pipeline_layouts(tmp_path):
    """Saved by pp=2 (ZB-V, V placement: rank 0 holds the first and the last chunk) after step 1; resumed by
    pp=4 (1F1B, 4 ranks) and by the 1-rank run: both continue exactly as the uninterrupted run."""
    model = "tiny-deepseek-v3"
    ref = execute(job(model, "", 1, steps=3))
    saved = job(model, "pp=2,vpp=2", 2, "zbv", steps=1, checkpoint_dir=str(tmp_path / "ckpt"), save_every=1)
    launch_function(run_jobs, ([saved],), 2)
    resumed_pp4 = launch_function(
        run_jobs, ([job(model, "pp=4", 4, "1f1b", steps=3, checkpoint_dir=str(tmp_path / "ckpt"), resume=True)],), 4
    )[0][0]
    resumed_pp1 = execute(job(model, "", 1, steps=3, checkpoint_dir=str(tmp_path / "ckpt"), resume=True))
    for resumed in (resumed_pp4, resumed_pp1):
        assert resumed["first_step"] == 1
        assert resumed["losses"] == pytest.approx(ref["losses"][1:], rel=LOSS_RTOL)


@pytest.mark.slow
def test_compiled_chunks_match_the_one_rank_run(tmp_path, monkeypatch):
    """--compile: every chunk captured and compiled by trex on its own (its own dump directory), under 1F1B and
    under interleaved 1F1B (two chunks per rank). ZB-V / DualPipeV with --compile are refused (test_pipeline_split)."""
    monkeypatch.setenv("TREX_DUMP", str(tmp_path / "dumps"))
    model = "tiny-qwen3-moe"
    ref = execute(job(model, "", 1, gather_gradients=True))
    cases = [("pp=2", "1f1b"), ("pp=2,vpp=2", "interleaved")]
    jobs = [job(model, plan, 2, schedule, compile=True, gather_gradients=True) for plan, schedule in cases]
    results = launch_function(run_jobs, (jobs,), 2)
    for (plan, schedule), result in zip(cases, results[0]):
        assert_same_run(result, ref, f"{model} {plan} {schedule} --compile")
    dumps = sorted(p.name for p in (tmp_path / "dumps").iterdir())
    assert {"rank0-chunk0", "rank1-chunk1", "rank0-chunk2", "rank1-chunk3"} <= set(dumps), dumps


@pytest.mark.slow
def test_trex_train_json_reports_the_bubble():
    """`trex train --plan "pp=2,vpp=2" --schedule interleaved --json`: losses, bubble measured and predicted."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "trex", "train", "--model", "tiny-qwen3-moe", "--plan", "pp=2,vpp=2"]
    command += ["--schedule", "interleaved", "--nproc", "2", "--steps", "2", "--seq", "16", "--gbs", "4", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and len(summary["losses"]) == 2
    bubble = summary["bubble_fraction"]
    assert 0 <= bubble["measured"] < 1
    assert bubble["predicted_closed_form"] == pytest.approx(1 / 9)  # (p-1)/(v*m+p-1), p=2, v=2, m=4
    assert summary["pipeline"]["split"].startswith("stage 0: layers 0-0 +embedding, layers 2-2")
