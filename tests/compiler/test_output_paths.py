"""Every path trex writes is checked before the work starts (trex.outputs), and dump directories never
lose files trex did not write."""

from __future__ import annotations

import pytest
import torch

import trex
from trex.cli import main
from trex.outputs import OutputPathError, output_dir, output_file


def test_output_dir_creates_missing_parents(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    assert output_dir(target, "--out") == target and target.is_dir()


def test_output_dir_refuses_an_existing_file_naming_option_and_path(tmp_path):
    existing = tmp_path / "file.txt"
    existing.write_text("keep me")
    with pytest.raises(OutputPathError, match=r"--out .*file\.txt: this is an existing file"):
        output_dir(existing, "--out")
    assert existing.read_text() == "keep me"


def test_output_under_a_file_is_refused(tmp_path):
    existing = tmp_path / "file.txt"
    existing.write_text("")
    with pytest.raises(OutputPathError, match="is a file"):
        output_file(existing / "trace.json", "--trace")
    with pytest.raises(OutputPathError, match="is a file"):
        output_dir(existing / "dump", "--dump")


def test_output_file_refuses_a_directory(tmp_path):
    with pytest.raises(OutputPathError, match="this is a directory"):
        output_file(tmp_path, "--trace")


def test_unwritable_location_is_refused():
    with pytest.raises(OutputPathError, match="--out /proc/trex-output"):
        output_dir("/proc/trex-output", "--out")


def test_estimate_trace_into_a_directory_fails_before_pricing(tmp_path, capsys):
    code = main(
        [
            "estimate",
            "--model",
            "gpt-22b",
            "--cluster",
            "a100",
            "--devices",
            "8",
            "--plan",
            "tp=8",
            "--trace",
            str(tmp_path),
        ]
    )
    assert code == 2 and "--trace" in capsys.readouterr().err


def test_estimate_trace_creates_its_parent_directories(tmp_path, capsys):
    trace = tmp_path / "deep" / "er" / "step.json"
    assert (
        main(
            [
                "estimate",
                "--model",
                "gpt-22b",
                "--cluster",
                "a100",
                "--devices",
                "8",
                "--plan",
                "tp=8",
                "--trace",
                str(trace),
            ]
        )
        == 0
    )
    assert trace.is_file()


def test_plan_out_under_a_file_fails_before_the_search(tmp_path, capsys):
    blocker = tmp_path / "plans"
    blocker.write_text("")
    code = main(
        ["plan", "--model", "gpt-22b", "--cluster", "a100", "--devices", "8", "--out", str(blocker / "best.json")]
    )
    assert code == 2 and "--out" in capsys.readouterr().err


def test_trex_dump_pointing_at_a_file_is_refused_before_capture(tmp_path, monkeypatch):
    blocker = tmp_path / "dump"
    blocker.write_text("")
    monkeypatch.setenv("TREX_DUMP", str(blocker))
    with pytest.raises(OutputPathError, match="TREX_DUMP"):
        trex.compile(torch.nn.Linear(2, 2))


def test_a_file_trex_did_not_write_is_never_overwritten_in_a_dump(tmp_path):
    mine = tmp_path / "graph_0_joint" / "summary.txt"
    mine.parent.mkdir()
    mine.write_text("my own notes")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = trex.compile(model, dump_dir=tmp_path)
    with pytest.raises(OutputPathError, match="trex did not write it"):
        compiled(torch.randn(2, 4)).sum().backward()
    assert mine.read_text() == "my own notes"
