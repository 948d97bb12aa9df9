"""The OR post-training loop: data reading, labels, packing, SFT/CPT runs, plans, kill-safe resume, export."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trex.cli import main
from trex.errors import TrexError
from trex.workloads.or_train.packing import PackedSource, build_rows, isolates_documents, row_tensors
from trex.workloads.or_train.samples import IGNORE, encode_chat, read_dataset
from trex.workloads.or_train.tokenizer import byte_tokenizer, load_tokenizer


def write_chat_set(directory: Path, n: int = 200, seed: int = 0, extra_lines: tuple[str, ...] = ()) -> Path:
    """Short OR-flavoured chats (a tiny model can learn them in a few dozen steps) and CPT notes."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "sft.jsonl", "w") as out:
        for _ in range(n):
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            messages = [
                {"role": "system", "content": "You are an OR expert."},
                {"role": "user", "content": f"Maximize {a}x + {b}y with x + y <= {a + b}, x, y >= 0."},
                {"role": "assistant", "content": f"All on the better item. Optimal objective: {max(a, b) * (a + b)}."},
            ]
            out.write(json.dumps({"messages": messages}) + "\n")
        for line in extra_lines:
            out.write(line + "\n")
    with open(directory / "cpt.jsonl", "w") as out:
        for _ in range(n // 2):
            out.write(json.dumps({"text": f"An LP with {rng.randint(2, 9)} variables is optimal at a vertex."}) + "\n")
    return directory


# -- data -------------------------------------------------------------------------------------------
def test_chat_labels_cover_the_assistant_turns_only():
    tokenizer = byte_tokenizer()
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": "answer"},
    ]
    encoded = encode_chat(messages, tokenizer)
    assert list(encoded.ids) == tokenizer.apply_chat_template(messages, tokenize=True)["input_ids"]
    trained = [i for i, label in zip(encoded.ids, encoded.labels, strict=True) if label != IGNORE]
    assert tokenizer.decode(trained) == "answer<|end|>"


def test_builtin_tokenizer_round_trips_through_save_pretrained(tmp_path):
    tokenizer = byte_tokenizer()
    tokenizer.save_pretrained(str(tmp_path))
    again = load_tokenizer(str(tmp_path))
    text = "min 3x₁ + 2y ≤ 7"
    assert again.decode(again(text)["input_ids"]) == text
    assert len(again) == len(tokenizer) and again.chat_template == tokenizer.chat_template


def test_bad_lines_are_counted_and_kept_never_dropped_silently(tmp_path):
    lines = ("{not json", json.dumps({"messages": [{"role": "robot", "content": "x"}]}), json.dumps({"messages": []}))
    write_chat_set(tmp_path, n=5, extra_lines=lines)
    tokenizer = byte_tokenizer()
    data = read_dataset(tmp_path / "sft.jsonl", "sft", tokenizer, max_tokens=200)
    assert len(data.samples) == 5
    assert dict(data.rejected.counts) == {"malformed_json": 1, "unknown_role": 1, "no_messages": 1}
    assert [r["line"] for r in data.rejected.lines] == [6, 7, 8]
    assert "robot" in data.rejected.lines[1]["detail"]
    with pytest.raises(TrexError, match="5 too_long"):
        read_dataset(tmp_path / "sft.jsonl", "sft", tokenizer, max_tokens=40)
    cut = read_dataset(tmp_path / "sft.jsonl", "sft", tokenizer, max_tokens=100, overlength="truncate")
    assert cut.truncated == 5 and all(len(s.ids) == 100 for s in cut.samples)


def test_no_usable_sample_is_an_error_naming_the_fix(tmp_path):
    write_chat_set(tmp_path, n=3)
    with pytest.raises(TrexError, match="raise --seq or pass --overlength truncate"):
        read_dataset(tmp_path / "sft.jsonl", "sft", byte_tokenizer(), max_tokens=20)


def test_packed_rows_restart_positions_and_never_score_across_documents():
    tokenizer = byte_tokenizer()
    chats = [[{"role": "user", "content": "q" * k}, {"role": "assistant", "content": "a" * k}] for k in (3, 5, 4)]
    samples = [encode_chat(c, tokenizer, i) for i, c in enumerate(chats)]
    rows = build_rows(samples, [0, 1, 2], seq=40, pad_id=tokenizer.pad_token_id, pack=True)
    assert len(rows) == 1 and rows[0].samples == 3
    batch = row_tensors(rows)
    lengths = [len(s.ids) for s in samples]
    starts = [0, lengths[0], lengths[0] + lengths[1]]
    for start in starts:
        assert batch.position_ids[0, start] == 0
    for start in starts[1:]:  # the token before a document's first token predicts nothing
        assert batch.targets[0, start - 1] == IGNORE
    scored = batch.targets[0][batch.targets[0] != IGNORE]
    assert tokenizer.decode(scored.tolist()).count("<|end|>") == 3  # every answer's end, nothing of the padding
    unpacked = build_rows(samples, [0, 1, 2], seq=40, pad_id=tokenizer.pad_token_id, pack=False)
    assert len(unpacked) == 3


def test_data_order_depends_on_seed_and_step_only():
    tokenizer = byte_tokenizer()
    samples = [
        encode_chat([{"role": "user", "content": str(i)}, {"role": "assistant", "content": "x"}], tokenizer, i)
        for i in range(10)
    ]
    a = PackedSource(samples, seq=64, gbs=2, seed=3, pad_id=tokenizer.pad_token_id, pack=False)
    b = PackedSource(samples, seq=64, gbs=2, seed=3, pad_id=tokenizer.pad_token_id, pack=False)
    assert torch.equal(a.global_batch(7).inputs, b.global_batch(7).inputs)  # b never saw steps 0..6
    first_epoch = [row.ids for step in range(5) for row in a.rows_of_step(step)]
    assert len({tuple(ids) for ids in first_epoch}) == 10  # every sample once per epoch
    assert a.samples_before(5) == 10 and a.samples_before(6) == 12


def test_packing_isolation_is_checked_on_the_model():
    from trex.models import build_model, tiny_config

    qwen = tiny_config("qwen3-moe")
    assert isolates_documents(build_model(qwen, seed=0), qwen.vocab_size, 32)[0]
    v4 = tiny_config("deepseek-v4")  # compressed attention (CSA/HCA) summarises the whole row
    assert not isolates_documents(build_model(v4, seed=0), v4.vocab_size, 32)[0]


# -- runs -------------------------------------------------------------------------------------------
SFT = ["--model", "tiny-deepseek-v4", "--seq", "160", "--gbs", "4", "--mbs", "4", "--lr", "3e-3", "--json"]


def run_json(capsys, args: list[str]) -> dict:
    assert main(args) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_sft_learns_exports_and_reports(tmp_path, capsys):
    data = write_chat_set(tmp_path / "data", extra_lines=("garbage",))
    out = tmp_path / "run"
    summary = run_json(capsys, ["train", "sft", *SFT, "--data", str(data), "--out", str(out), "--steps", "30"])
    losses = summary["losses"]
    assert len(losses) == 30 and summary["first_step"] == 0
    assert min(losses[-5:]) < losses[0] / 2, losses  # a real learning signal
    assert summary["samples_seen"] == 120 and summary["tokens_per_s"] > 0
    assert summary["rejected"] == {"malformed_json": 1} and summary["packing"] == "off"
    assert summary["learning_rates"][0] == pytest.approx(3e-3) and summary["learning_rates"][-1] < 1e-3
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out / "sft" / "hf")
    tokenizer = AutoTokenizer.from_pretrained(out / "sft" / "hf")
    assert model.config.vocab_size == len(tokenizer) == 262
    assert json.loads((out / "sft" / "rejected.jsonl").read_text())["text"] == "garbage"
    evaluation = ["eval", "--bench", "nl4opt", "--client", "transformers", "--model", str(out / "sft" / "hf")]
    evaluation += ["--limit", "2", "--max-tokens", "8", "--no-compile", "--no-progress", "--json"]
    report = run_json(capsys, evaluation)  # the exported checkpoint is what trex eval reads
    assert report["n"] == 2 and report["correct"] + sum(report["failures"].values()) == 2


def test_losses_equal_across_plans_on_two_ranks(tmp_path, capsys):
    data = write_chat_set(tmp_path / "data", n=40)
    common = ["train", "sft", *SFT, "--data", str(data), "--steps", "3", "--mbs", "2"]
    one = run_json(capsys, common)
    two = run_json(capsys, [*common, "--nproc", "2", "--plan", "ep=2"])
    assert two["world_size"] == 2
    for a, b in zip(one["losses"], two["losses"], strict=True):
        assert abs(a - b) <= 1e-5 * abs(a)
    assert one["samples_seen"] == two["samples_seen"]


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_kill_9_mid_run_then_resume_gives_the_uninterrupted_weights(tmp_path, capsys):
    data = write_chat_set(tmp_path / "data", n=40)
    common = ["train", "sft", *SFT, "--data", str(data), "--steps", "8", "--save-every", "1"]
    whole = run_json(capsys, [*common, "--out", str(tmp_path / "whole")])
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trex", *common, "--out", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while not (out / "sft" / "checkpoints" / "step-000004").exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "sft" / "hf").exists()
    resumed = run_json(capsys, [*common, "--out", str(out), "--resume"])
    assert resumed["first_step"] >= 4 and resumed["first_step"] < 8
    assert resumed["losses"] == whole["losses"][resumed["first_step"] :]
    assert resumed["samples_seen"] == whole["samples_seen"]
    a, b = _safetensors(tmp_path / "whole" / "sft" / "hf"), _safetensors(out / "sft" / "hf")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_dry_run_prices_v4_flash_on_cloudmatrix_without_weights(capsys):
    report = run_json(
        capsys,
        [
            "train",
            "sft",
            "--model",
            "deepseek-v4-flash",
            "--cluster",
            "cloudmatrix384",
            "--devices",
            "256",
            "--seq",
            "4096",
            "--gbs",
            "256",
            "--dry-run",
            "--epochs",
            "2",
            "--json",
        ],
    )
    assert report["weights_allocated"] is False and report["steps"] == 79  # ceil(10,000 x 2 / 256)
    assert report["step_time_s"] > 0 and 0 < report["mfu"] < 1 and report["memory_per_device_gib"] > 0
    assert report["time_for_data_s"] == pytest.approx(report["steps"] * report["step_time_s"])


def test_sft_without_data_or_with_a_foreign_tokenizer_is_refused(tmp_path, capsys):
    assert main(["train", "sft", "--model", "tiny-qwen3-moe"]) != 0
    assert "needs --data" in capsys.readouterr().err
    assert main(["train", "sft", "--model", "tiny-qwen3-moe", "--data", str(tmp_path)]) != 0
    assert "the directory has no sft.jsonl" in capsys.readouterr().err
    data = write_chat_set(tmp_path / "data", n=3)
    assert (
        main(["train", "sft", "--model", "tiny-qwen3-moe", "--data", str(data), "--tokenizer", str(tmp_path / "nope")])
        != 0
    )
    assert "not a directory" in capsys.readouterr().err
    assert (
        main(["train", "sft", "--model", "deepseek-v3", "--data", str(data), "--tokenizer", "byte", "--seq", "4096"])
        != 0
    )


@pytest.mark.slow
def test_pipeline_runs_cpt_sft_eval_and_resumes_finished_phases(tmp_path, capsys):
    data = write_chat_set(tmp_path / "data", n=20)
    args = ["train", "pipeline", "--model", "tiny-qwen3-moe", "--data", str(data), "--out", str(tmp_path / "run")]
    args += ["--steps", "3", "--seq", "160", "--gbs", "4", "--mbs", "4", "--limit", "1", "--eval-max-tokens", "8"]
    report = run_json(capsys, [*args, "--bench", "nl4opt", "--json"])
    assert set(report["phases"]) == {"cpt", "sft"} and len(report["phases"]["sft"]["losses"]) == 3
    result = report["evaluation"]["nl4opt"]
    assert (
        result["n"] == 1 and result["rule"] == "lenient" and sum(result["failures"].values()) + result["correct"] == 1
    )
    assert any("pass@1 near 0" in note for note in report["notes"])
    again = run_json(capsys, [*args, "--bench", "nl4opt", "--json", "--resume"])
    assert again["phases"]["sft"]["losses"] == report["phases"]["sft"]["losses"]  # read back, not re-run


def test_muon_is_plan_independent_and_resumes_under_another_plan(tmp_path, capsys):
    data = write_chat_set(tmp_path / "data", n=40)
    common = ["train", "sft", *SFT, "--data", str(data), "--mbs", "2", "--optimizer", "muon", "--no-compile"]
    common += ["--min-lr-ratio", "1"]  # a constant learning rate: the runs below stop at different --steps
    whole = run_json(capsys, [*common, "--steps", "4"])
    ckpt = ["--checkpoint-dir", str(tmp_path / "ck"), "--save-every", "2"]
    first = run_json(capsys, [*common, "--steps", "2", "--nproc", "2", "--plan", "ep=2,zero=0", *ckpt])
    rest = run_json(capsys, [*common, "--steps", "4", *ckpt, "--resume"])  # one rank resumes the 2-rank run
    assert rest["first_step"] == 2
    # torch's Muon runs its Newton-Schulz iteration in bf16 (torch/optim/_muon.py: `grad.bfloat16()`): the fp32
    # gradient sums of another plan differ in their last bits (reduction order), which can move a bf16 rounding of
    # the momentum (2**-8 relative) for a few elements. The losses then agree to bf16's effect on one update, not to
    # fp32's: seen 3e-5 relative at the fourth step on an AVX-512/AMX CPU (1e-7 on the steps before Muon acts).
    for a, b in zip(whole["losses"], first["losses"] + rest["losses"], strict=True):
        assert abs(a - b) <= 2e-4 * abs(a)
    # resuming under the same plan is exact: the same sums in the same order
    ckpt_one = ["--checkpoint-dir", str(tmp_path / "ck1"), "--save-every", "2"]
    run_json(capsys, [*common, "--steps", "2", *ckpt_one])
    again = run_json(capsys, [*common, "--steps", "4", *ckpt_one, "--resume"])
    assert again["losses"] == whole["losses"][2:]
    assert main([*common, "--steps", "2", "--nproc", "2", "--plan", "zero=1"]) != 0
    assert "orthogonalises whole weight matrices" in capsys.readouterr().err


def test_plan_auto_is_the_planners_choice_among_runnable_plans():
    from trex.models import tiny_config
    from trex.runtime.run_plan import resolve_plan, runtime_limits

    for family in ("deepseek-v4", "qwen3-moe"):
        config = tiny_config(family)
        plan = resolve_plan("auto", config, 2, seq=64, gbs=8, mbs=1, precision="fp32")
        assert plan.devices == 2 and not runtime_limits(plan, config.model_type)
