"""`trex eval` never reports a run that checked nothing as a score, and never overwrites a report of
other settings (issue: a user's first hour)."""

from __future__ import annotations

import json

import pytest

from trex.cli import main


def _predictions(tmp_path) -> str:
    records = [
        {"question": "q0", "answer": 3, "program": "print('Optimal objective value: 3')"},
        {"question": "q1", "answer": 5, "program": "print('Optimal objective value: 4')"},
    ]
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _eval(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["eval", "--no-progress", "--isolation", "process", "--client", "replay", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("limit", ["0", "-5"])
def test_a_limit_that_selects_nothing_is_an_error_not_a_zero_score(capsys, tmp_path, limit):
    code, out, err = _eval(capsys, "--predictions", _predictions(tmp_path), "--limit", limit)
    assert code == 2 and out == ""
    assert f"--limit {limit}" in err and "positive" in err


def test_pass_at_k_beyond_the_samples_is_an_error_naming_the_fix(capsys, tmp_path):
    code, out, err = _eval(capsys, "--predictions", _predictions(tmp_path), "--k", "1,8")
    assert code == 2 and out == ""
    assert "pass@8 needs at least 8 samples" in err and "--samples" in err


def test_an_empty_benchmark_is_an_error(capsys, tmp_path):
    bench = tmp_path / "empty.jsonl"
    bench.write_text("")
    code, _, err = _eval(capsys, "--predictions", _predictions(tmp_path), "--bench", str(bench))
    assert code == 2 and ("no items" in err or "empty" in err), err


def test_out_that_is_a_file_is_refused_before_anything_runs(capsys, tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("my notes")
    code, _, err = _eval(capsys, "--predictions", _predictions(tmp_path), "--out", str(blocker))
    assert code == 2 and "--out" in err and "existing file" in err
    assert blocker.read_text() == "my notes"


def test_a_report_of_other_settings_is_kept_and_the_new_one_written_alongside(capsys, tmp_path):
    out_dir = tmp_path / "run"
    predictions = _predictions(tmp_path)
    assert _eval(capsys, "--predictions", predictions, "--out", str(out_dir))[0] == 0
    first = (out_dir / "report.json").read_text()
    code, _, err = _eval(capsys, "--predictions", predictions, "--out", str(out_dir), "--rule", "lenient")
    assert code == 0
    assert (out_dir / "report.json").read_text() == first, "the strict report must not be overwritten"
    alongside = [p for p in out_dir.glob("report.*.json")]
    assert len(alongside) == 1 and json.loads(alongside[0].read_text())["rule"] == "lenient"
    assert "kept" in err
    assert (
        _eval(capsys, "--predictions", predictions, "--out", str(out_dir))[0] == 0
    )  # same settings: rewrites report.json
    assert json.loads((out_dir / "report.json").read_text())["rule"] == "strict"
