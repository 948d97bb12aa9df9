"""`trex data`: synth, stats, verify and families from the command line, and its user errors."""

from __future__ import annotations

import json

import pytest

from trex.cli import main
from trex.errors import TrexError


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli-run")
    code = main(
        [
            "data",
            "synth",
            "--n",
            "4",
            "--out",
            str(out),
            "--seed",
            "2",
            "--shard-size",
            "2",
            "--no-progress",
            "--no-decontaminate",
            "--isolation",
            "process",
        ]
    )
    assert code == 0
    return out


def test_synth_writes_the_outputs_and_prints_the_statistics(finished, capsys):
    assert {p.name for p in finished.iterdir()} >= {
        "manifest.json",
        "shards",
        "sft.jsonl",
        "cpt.jsonl",
        "stats.json",
        "stats.md",
        "decontamination.json",
    }
    assert len((finished / "sft.jsonl").read_text().splitlines()) == 4
    assert (
        json.loads((finished / "decontamination.json").read_text())["benchmarks"] is None
    )  # --no-decontaminate says so


def test_stats_prints_a_finished_runs_report_and_an_unfinished_runs_progress(finished, tmp_path, capsys):
    assert main(["data", "stats", str(finished), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 4
    code = main(
        [
            "data",
            "synth",
            "--n",
            "50",
            "--out",
            str(tmp_path),
            "--shard-size",
            "2",
            "--max-shards",
            "1",
            "--no-progress",
            "--no-decontaminate",
            "--isolation",
            "process",
        ]
    )
    assert code == 0 and "run again to resume" in capsys.readouterr().out
    assert main(["data", "stats", str(tmp_path), "--json"]) == 0
    progress = json.loads(capsys.readouterr().out)
    assert (
        progress == {"finished": False, "shards": 1, "indices": 2, "results": progress["results"]}
        and sum(progress["results"].values()) == 2
    )


def test_verify_passes_a_genuine_run_and_catches_a_tampered_objective(finished, tmp_path, capsys):
    assert main(["data", "verify", str(finished), "--isolation", "process"]) == 0
    assert "checked 4 samples: 0 failed" in capsys.readouterr().out
    lines = (finished / "sft.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    if record["meta"]["objective"] is None:
        record["meta"]["status"], record["meta"]["objective"] = "optimal", 1.0
    else:
        record["meta"]["objective"] += 1.0
    (tmp_path / "sft.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["data", "verify", str(tmp_path), "--isolation", "process"]) == 1
    assert "meta.program reaches" in capsys.readouterr().out


def test_families_lists_every_family_with_its_statuses(capsys):
    assert main(["data", "families"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 12 and any("unbounded" in line for line in lines)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--no-programmatic"], "leaves no teacher"),
        (["--families", "transportation,sudoku"], "unknown families ['sudoku']"),
        (["--bench-dir", "/nonexistent/bench"], "--bench-dir /nonexistent/bench: no such directory"),
        (["--families", ","], "selects no family"),
        (["--infeasible-share", "0.7", "--unbounded-share", "0.5"], "exceed 1"),
        (["--infeasible-share", "0.6"], "labelled minority"),
        (["--keep-unanimous", "2"], "keep_unanimous must lie in [0, 1]"),
    ],
)
def test_user_errors_exit_2_with_what_to_do(tmp_path, capsys, arguments, message):
    assert main(["data", "synth", "--n", "1", "--out", str(tmp_path / "x"), "--no-progress", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_resuming_with_another_seed_is_refused(finished, capsys):
    assert (
        main(
            [
                "data",
                "synth",
                "--n",
                "4",
                "--out",
                str(finished),
                "--seed",
                "3",
                "--shard-size",
                "2",
                "--no-progress",
                "--no-decontaminate",
                "--isolation",
                "process",
            ]
        )
        == 2
    )
    assert "seed" in capsys.readouterr().err


def test_endpoint_teacher_and_reflection_judge_are_built_from_the_command_line(tmp_path, capsys):
    from workload_helpers import FakeOpenAIServer

    server = FakeOpenAIServer(
        respond=lambda prompt: "VERDICT: PASS" if "VERDICT" in prompt else "I would need more time."
    )
    try:
        code = main(
            [
                "data",
                "synth",
                "--n",
                "2",
                "--out",
                str(tmp_path),
                "--shard-size",
                "2",
                "--no-progress",
                "--no-decontaminate",
                "--isolation",
                "process",
                "--teacher-openai",
                server.url,
                "tiny",
                "--judge-openai",
                server.url,
                "judge",
                "--json",
            ]
        )
    finally:
        server.stop()
    assert code == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["dta_signals"] == {"contested": 2}  # the endpoint wrote no program; the verified answer is kept
    prompts = [request["messages"][-1]["content"] for request in server.requests]
    assert sum("VERDICT" in prompt for prompt in prompts) == 2  # the judge reviewed the two passing answers only
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [teacher["name"] for teacher in manifest["config"]["teachers"]] == ["programmatic", "openai-1"]


def test_api_keys_come_from_the_environment_and_are_never_stored(tmp_path, monkeypatch, capsys):
    from trex.workloads.or_data.config import TeacherSpec

    monkeypatch.setenv("TREX_TEST_TEACHER_KEY", "s3cret-key")
    spec = TeacherSpec(
        "openai", "t", {"base_url": "http://127.0.0.1:9", "model": "m", "api_key_env": "TREX_TEST_TEACHER_KEY"}
    )
    assert spec.client().api_key == "s3cret-key"  # read when a worker builds the client
    main(
        [
            "data",
            "synth",
            "--n",
            "1",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--no-decontaminate",
            "--max-shards",
            "0",
            "--teacher-openai",
            "http://127.0.0.1:9",
            "m",
            "--api-key-env",
            "TREX_TEST_TEACHER_KEY",
        ]
    )
    manifest = (tmp_path / "manifest.json").read_text()
    assert "TREX_TEST_TEACHER_KEY" in manifest and "s3cret-key" not in manifest
    with pytest.raises(TrexError, match="api_key_env"):
        TeacherSpec("openai", "t", {"base_url": "http://x", "model": "m", "api_key": "s3cret-key"})


def test_decontamination_works_from_any_directory_with_the_shipped_index(tmp_path, capsys, monkeypatch):
    """No --bench-dir and no benchmark files nearby: the index shipped with trex is used."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TREX_OR_BENCH_DIR", raising=False)
    code = main(
        [
            "data",
            "synth",
            "--n",
            "2",
            "--out",
            "run",
            "--seed",
            "5",
            "--shard-size",
            "2",
            "--no-progress",
            "--isolation",
            "process",
        ]
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "run" / "decontamination.json").read_text())
    assert report["benchmarks"] is not None and "NL4OPT.json" in json.dumps(report["benchmarks"])


def test_verify_with_a_limit_that_checks_nothing_is_an_error(finished, capsys):
    assert main(["data", "verify", str(finished), "--limit", "0"]) == 2
    assert "checks nothing" in capsys.readouterr().err


def test_the_shipped_index_matches_the_benchmark_files():
    """The packaged index is the index of the benchmark files (rebuild it when they change)."""
    from pathlib import Path

    from trex.workloads.or_data.decontamination import BenchmarkIndex, packaged_index

    shipped = BenchmarkIndex.from_dir(packaged_index())
    bench = Path(__file__).resolve().parents[3] / "shared" / "data" / "or_bench"
    assert bench.is_dir(), f"the OR benchmark files belong at {bench} (../shared beside the checkout)"
    nl4opt = BenchmarkIndex(n=shipped.n, root=str(bench))
    nl4opt.add_file(bench / "NL4OPT.json")
    assert set(nl4opt.grams) <= set(shipped.grams)
    assert sorted(shipped.files) == sorted(p.name for p in bench.glob("*.json"))
