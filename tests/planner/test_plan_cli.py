"""`trex plan`: the command line a user plans with."""

from __future__ import annotations

import json

import pytest

from trex.cli import main
from trex.plan import Plan

SMALL = ["plan", "--model", "gpt-22b", "--cluster", "a100", "--devices", "16", "--seq", "2048", "--gbs", "32"]


def test_json_output_has_best_baseline_time_and_candidates(capsys):
    assert main([*SMALL, "--json", "--top", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    fields = {
        "tp",
        "pp",
        "vpp",
        "ep",
        "etp",
        "cp",
        "dp",
        "zero",
        "mbs",
        "recompute",
        "step_time_s",
        "mfu",
        "memory_per_device_gib",
    }
    assert fields <= set(out["best"]) and fields <= set(out["baseline"])
    assert out["baseline"]["recipe"] == "korthikanti-2022" and "Korthikanti" in out["baseline"]["source"]
    assert out["search_time_s"] > 0 and out["candidates"] > 0 and out["search_space"] >= out["candidates"]
    assert len(out["runners_up"]) == 2 and all(r["reason"] for r in out["runners_up"])
    assert out["best"]["step_time_s"] <= out["baseline"]["step_time_s"]


def test_human_output_shows_the_plan_memory_runners_up_and_baseline(capsys):
    assert main(SMALL) == 0
    out = capsys.readouterr().out
    for text in (
        "searched",
        "candidate plans",
        "degrees",
        "stage 0",
        "memory per device",
        "optimizer states",
        "runner-up 1:",
        "baseline korthikanti-2022",
        "x the baseline's throughput",
    ):
        assert text in out


def test_out_writes_a_plan_file_and_diff_compares_two(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main([*SMALL, "--out", str(a), "--json"]) == 0
    assert main([*SMALL, "--out", str(b), "--json", "--fix", "tp=4"]) == 0
    capsys.readouterr()
    assert Plan.load(a).parallel.tp != 4 or Plan.load(b).parallel.tp == 4
    assert main(["plan", "--diff", str(a), str(a)]) == 0
    assert "are the same plan" in capsys.readouterr().out
    assert main(["plan", "--diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "parallel.tp:" in out and "-> 4" in out


@pytest.mark.parametrize(
    "args, listed",
    [
        (["--model", "gpt-23b", "--cluster", "a100", "--devices", "8"], "valid models: "),
        (["--model", "gpt-22b", "--cluster", "a101", "--devices", "8"], "valid clusters: a100, ascend-910b"),
        (
            ["--model", "gpt-22b", "--cluster", "a100", "--devices", "8", "--baseline", "megatron"],
            "valid baseline recipes: ",
        ),
    ],
)
def test_unknown_names_list_the_valid_ones(args, listed, capsys):
    assert main(["plan", *args]) == 2
    assert listed in capsys.readouterr().err


def test_no_feasible_plan_shows_the_closest_and_the_memory_missing(capsys):
    assert (
        main(
            [
                "plan",
                "--model",
                "gpt-1t",
                "--cluster",
                "a100",
                "--devices",
                "8",
                "--seq",
                "2048",
                "--gbs",
                "8",
                "--baseline",
                "none",
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "no plan fits" in out and "closest plan" in out and "missing" in out and "optimizer states" in out


def test_a_plan_file_for_another_model_is_rejected_by_diff_only_if_malformed(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert main(["plan", "--diff", str(bad), str(bad)]) == 2
    assert "a plan is a JSON object" in capsys.readouterr().err


def test_missing_required_options_are_named(capsys):
    assert main(["plan", "--model", "gpt-22b"]) == 2
    assert "--cluster, --devices are required" in capsys.readouterr().err


def test_list_baselines_names_each_recipe_with_its_source(capsys):
    assert main(["plan", "--list-baselines"]) == 0
    out = capsys.readouterr().out
    assert (
        "megatron-bridge-dsv4-pro" in out
        and "automodel-dsv4-pro-sft" in out
        and "source: NVIDIA-NeMo/Automodel @ 481c1842" in out
    )


def test_a_tiny_test_model_name_plans(tmp_path, capsys):
    from trex.cli import main

    assert (
        main(
            [
                "plan",
                "--model",
                "tiny-qwen3-moe",
                "--cluster",
                "cpu",
                "--devices",
                "1",
                "--seq",
                "32",
                "--gbs",
                "2",
                "--baseline",
                "none",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "tiny-qwen3-moe" and out["best"]["tp"] == 1


def test_the_cost_models_caveats_reach_the_printed_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TREX_CACHE_DIR", str(tmp_path))  # no calibrated cpu profile saved there
    assert (
        main(
            [
                "plan",
                "--model",
                "tiny-qwen3-moe",
                "--cluster",
                "cpu",
                "--devices",
                "1",
                "--seq",
                "32",
                "--gbs",
                "2",
                "--baseline",
                "none",
                "--json",
            ]
        )
        == 0
    )
    notes = json.loads(capsys.readouterr().out)["best"]["notes"]
    assert any("not calibrated" in note for note in notes)


@pytest.mark.parametrize(
    "sets, message",
    [
        (["dispatcher=deepep", "dispatcher=alltoall"], "--set dispatcher is given twice"),
        (["seq=8"], "seq is set with --seq"),
        (["tp=2"], "software settings may not fix searched fields (tp)"),
    ],
)
def test_set_never_silently_overrides(capsys, sets, message):
    argv = list(SMALL)
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_gain_that_rests_on_small_expert_gemms_is_flagged(capsys):
    # Q3-C's layout (16 experts of 512 rows per micro-batch) against the ModelZoo's Q3-A layout (4 of 4096): the model
    # prices the first ~2x optimistically (published runs), so the printed gain carries a caution; the plan its note
    qwen = [
        "plan",
        "--model",
        "qwen3-235b-a22b",
        "--cluster",
        "h100",
        "--devices",
        "256",
        "--seq",
        "4096",
        "--gbs",
        "2048",
    ]
    assert main([*qwen, "--fix", "tp=4,pp=8,vpp=4,ep=8,cp=1,zero=1,mbs=1,recompute=none"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "each local expert gets 512 rows per micro-batch" in out
    assert "caution: the best plan's experts get few rows per micro-batch" in out and "this gain is overstated" in out
    assert "--fix min_expert_rows=2048 plans outside that regime" in out
    assert main([*qwen, "--fix", "tp=2,pp=8,vpp=4,ep=32,cp=1,zero=1,mbs=1,recompute=none"]) == 0
    assert "caution: the best plan's experts" not in " ".join(capsys.readouterr().out.split())
