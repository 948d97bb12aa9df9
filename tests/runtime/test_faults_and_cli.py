"""`trex train` refuses bad plans before any process starts, and a dead rank ends the run in bounded time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trex.cli import main
from trex.errors import TrexError
from trex.models import tiny_config
from trex.runtime.run_plan import PlanRefused, resolve_plan

TRAIN = [sys.executable, "-m", "trex", "train"]


def refusal(text: str, nproc: int, family: str = "qwen3-moe", **training) -> str:
    shape = {"seq": 16, "gbs": 4, "mbs": 1, **training}
    with pytest.raises(PlanRefused) as error:
        resolve_plan(text, tiny_config(family), nproc, **shape)
    return str(error.value)


def test_plan_inconsistent_with_nproc_is_refused_with_the_numbers():
    assert "tp*pp*cp = 2*1*1 = 2 does not divide --nproc=3" in refusal("tp=2", 3)


def test_ep_not_dividing_the_experts_is_refused():
    assert "ep=3 does not divide the 8 experts" in refusal("ep=3", 3)


def test_tp_not_dividing_the_heads_is_refused():
    assert "tp=8 does not divide the 4 attention heads" in refusal("tp=8", 8, seq=16)


def test_unimplemented_parallelism_is_refused_naming_what_is_supported():
    message = refusal("cp=2", 2)
    assert "context parallelism is not executed" in message and "supported: dp (zero=0,1,2,3)" in message
    resolve_plan("pp=2,tp=2", tiny_config("qwen3-moe"), 4, seq=16, gbs=4, mbs=1)  # tp inside pipeline stages runs
    assert "context parallelism is not executed" in refusal("cp=2", 2)
    assert "etp=2: expert tensor parallelism is not executed" in refusal("etp=2", 2)


def test_head_parallel_attention_refusals_carry_the_numbers():
    """V4's grouped output projection splits by whole groups; sequence parallelism splits --seq."""
    assert "tp=4 does not divide the 2 output-projection groups (o_groups) of deepseek_v4" in refusal(
        "tp=4", 4, family="deepseek-v4", gbs=4
    )
    assert "use a --seq divisible by 2" in refusal("tp=2", 2, family="deepseek-v3", seq=15)
    resolve_plan("tp=2,zero=3", tiny_config("deepseek-v4"), 4, seq=16, gbs=4, mbs=1)  # accepted


def test_vocabulary_tp_cannot_split_is_refused():
    """The embedding and the head are split by vocabulary rows; a tied pair cannot be split two ways."""
    config = tiny_config("qwen3-moe", vocab_size=126)
    with pytest.raises(PlanRefused, match="tp=4 does not divide the vocabulary of 126 rows"):
        resolve_plan("tp=4", config, 4, seq=16, gbs=4, mbs=1)
    tied = tiny_config("qwen3-moe")
    tied.tie_word_embeddings = True
    with pytest.raises(PlanRefused, match="ties its embedding and LM head"):
        resolve_plan("tp=2", tied, 2, seq=16, gbs=4, mbs=1)
    resolve_plan("tp=2", tiny_config("qwen3-moe", vocab_size=126), 2, seq=16, gbs=4, mbs=1)  # 126 = 2 x 63


def test_batch_that_does_not_split_over_replicas_is_refused():
    assert "gbs=3 is not a multiple of mbs*dp = 1*2 = 2" in refusal("", 2, gbs=3)


def test_bad_plan_string_names_the_key():
    with pytest.raises(TrexError, match="unknown key 'tq'"):
        resolve_plan("tq=2", tiny_config("qwen3-moe"), 2, seq=16, gbs=4, mbs=1)


def test_cli_prints_the_refusal_and_starts_nothing(capsys, tmp_path):
    code = main(
        ["train", "--model", "tiny-qwen3-moe", "--plan", "ep=3", "--nproc", "2", "--progress-dir", str(tmp_path)]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "tp*pp*cp = 1*1*1" not in err and "ep=3 does not divide the 8 experts" in err
    assert not list(tmp_path.iterdir())  # no rank ever started


def test_resume_without_a_checkpoint_is_refused(capsys, tmp_path):
    code = main(["train", "--model", "tiny-qwen3-moe", "--checkpoint-dir", str(tmp_path), "--resume"])
    assert code == 2 and "no checkpoint in" in capsys.readouterr().err


@pytest.mark.parametrize("meta", [None, "{not json"])  # trex.json missing (a partial copy) or unreadable
def test_resume_of_a_corrupt_checkpoint_is_refused_and_keeps_it(capsys, tmp_path, meta):
    step = tmp_path / "step-00000002"
    step.mkdir()
    (tmp_path / "latest").write_text(step.name + "\n")
    if meta is not None:
        (step / "trex.json").write_text(meta)
    code = main(["train", "--model", "tiny-qwen3-moe", "--checkpoint-dir", str(tmp_path), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "corrupt" in err and "fresh --checkpoint-dir" in err, err
    assert (tmp_path / "latest").read_text().strip() == step.name and step.is_dir()  # nothing was removed


def test_one_rank_json_summary(capsys):
    code = main(["train", "--model", "tiny-qwen3-moe", "--steps", "2", "--seq", "8", "--gbs", "2", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(summary["losses"]) == 2 and summary["first_step"] == 0 and summary["world_size"] == 1
    memory = summary["memory_by_rank_bytes"][0]
    predicted = summary["predicted_memory_bytes"]
    # Parameters, gradients and optimizer states are arithmetic: measured equals predicted.
    for part in ("parameters", "gradients", "optimizer_states"):
        assert memory[part] == predicted[part], part
    # Activations: the eager implementation's saved tensors (runtime.activation_model), byte for byte on 1 rank.
    assert summary["predicted_activation_model"].startswith("transformers eager qwen3_moe")
    assert memory["activations"] == predicted["activations"]
    assert summary["step_time_s"] > 0 and summary["predicted_step_time_s"] > 0


@pytest.mark.slow  # ~50 s on a loaded 2-core machine: two spawned ranks must first reach step 2
def test_a_killed_rank_stops_the_run_naming_rank_and_step(tmp_path):
    progress = tmp_path / "progress"
    command = TRAIN + [
        "--model",
        "tiny-qwen3-moe",
        "--plan",
        "zero=1",
        "--nproc",
        "2",
        "--steps",
        "100000",
        "--seq",
        "8",
        "--gbs",
        "2",
        "--progress-dir",
        str(progress),
        "--timeout",
        "60",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        rank1 = progress / "rank1.json"
        deadline = time.monotonic() + 240
        state = None
        while time.monotonic() < deadline:
            try:
                state = json.loads(rank1.read_text())
            except (OSError, json.JSONDecodeError):
                state = None
            if state and state.get("step") is not None and state["step"] >= 2:
                break
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        assert state and state["step"] >= 2, "rank 1 never reached step 2"
        os.kill(state["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = proc.communicate(timeout=90)
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err[-2000:]
    match = re.search(r"rank 1 was killed by SIGKILL at step (\d+)", err)
    assert match, err[-2000:]
    assert int(match.group(1)) >= state["step"]
    assert elapsed < 60, f"the run took {elapsed:.0f} s to stop after rank 1 died"


def test_fresh_run_never_overwrites_checkpoints(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert (
        main(
            [
                "train",
                "--model",
                "tiny-qwen3-moe",
                "--steps",
                "1",
                "--seq",
                "8",
                "--gbs",
                "2",
                "--checkpoint-dir",
                str(ckpt),
                "--save-every",
                "1",
                "--json",
            ]
        )
        == 0
    )
    before = {p: p.stat().st_mtime_ns for p in Path(ckpt).rglob("*")}
    capsys.readouterr()
    assert (
        main(
            [
                "train",
                "--model",
                "tiny-qwen3-moe",
                "--steps",
                "2",
                "--seq",
                "8",
                "--gbs",
                "2",
                "--checkpoint-dir",
                str(ckpt),
            ]
        )
        == 2
    )
    assert "already holds checkpoints" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in Path(ckpt).rglob("*")} == before


def test_resume_of_another_model_is_refused(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert (
        main(
            [
                "train",
                "--model",
                "tiny-qwen3-moe",
                "--steps",
                "1",
                "--seq",
                "8",
                "--gbs",
                "2",
                "--checkpoint-dir",
                str(ckpt),
                "--save-every",
                "1",
                "--json",
            ]
        )
        == 0
    )
    capsys.readouterr()
    code = main(
        [
            "train",
            "--model",
            "tiny-deepseek-v3",
            "--steps",
            "2",
            "--seq",
            "8",
            "--gbs",
            "2",
            "--checkpoint-dir",
            str(ckpt),
            "--resume",
        ]
    )
    assert code == 2
    assert "is of another model ('tiny-qwen3-moe'" in capsys.readouterr().err


def test_a_killed_save_leaves_the_last_good_checkpoint(tmp_path, capsys):
    """A save that died half way (a .partial directory) is ignored; resume continues from `latest`, exactly."""
    ckpt = tmp_path / "ckpt"
    args = ["train", "--model", "tiny-qwen3-moe", "--seq", "8", "--gbs", "2", "--json"]
    assert main([*args, "--steps", "3"]) == 0
    straight = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["losses"]
    assert main([*args, "--steps", "1", "--checkpoint-dir", str(ckpt), "--save-every", "1"]) == 0
    capsys.readouterr()
    (ckpt / "step-000002.partial").mkdir()
    (ckpt / "step-000002.partial" / "__0_0.distcp").write_bytes(b"half a file")
    assert main([*args, "--steps", "3", "--checkpoint-dir", str(ckpt), "--resume", "--save-every", "1"]) == 0
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed["first_step"] == 1
    assert resumed["losses"] == pytest.approx(straight[1:], rel=1e-6)
    assert (ckpt / "latest").read_text().strip() == "step-000003"


def test_a_planner_plan_file_gives_its_degrees(tmp_path):
    from trex.cost_model.model_spec import spec_from_config
    from trex.cost_model.parallel import ParallelConfig
    from trex.plan import ModelShape, Plan

    config = tiny_config("qwen3-moe")
    shape = ModelShape.of(spec_from_config(config, "tiny-qwen3-moe"))
    path = Plan(shape, "cpu", 2, "cpu", ParallelConfig(ep=2, dp=2, zero=2, seq=16, gbs=4)).save(tmp_path / "plan.json")
    plan = resolve_plan(str(path), config, 2, seq=16, gbs=4, mbs=1)
    assert (plan.ep, plan.dp, plan.zero, plan.tp) == (2, 2, 2, 1)
    with pytest.raises(PlanRefused, match="was made for 2 devices; --nproc=4"):
        resolve_plan(str(path), config, 4, seq=16, gbs=4, mbs=1)
    with pytest.raises(PlanRefused, match="the plan was made for 4 decoder layers, the model has 2"):
        resolve_plan(str(path), tiny_config("qwen3-moe", num_layers=2), 2, seq=16, gbs=4, mbs=1)
