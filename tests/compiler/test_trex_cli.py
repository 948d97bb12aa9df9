"""The `trex` command line: --help everywhere, capture, demo, and clear errors."""

import json
import subprocess
import sys

import pytest

from trex.cli import COMMANDS, main


def test_trex_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for command in ("demo", "capture"):
        assert command in out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert f"usage: trex {command}" in capsys.readouterr().out


def test_capture_meta_json_reports_kinds_nodes_and_parameters(capsys):
    assert main(["capture", "qwen3-235b-a22b", "--meta", "--seq", "256", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_layers"] == 94 and report["kinds"][0]["count"] == 94
    assert report["kinds"][0]["nodes"]["joint"] > 0
    assert 230e9 < report["total_params"] < 240e9


def test_capture_meta_prints_a_table_with_totals(capsys, tmp_path):
    assert main(["capture", "tiny-deepseek-v4", "--meta", "--seq", "32", "--dump", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "attention=heavily_compressed_attention, mlp=hash_moe" in out
    assert "total parameters" in out and "active per token" in out
    assert (tmp_path / "kind_0" / "graph_0_joint" / "000_capture.py").exists()


def test_capture_without_meta_trains_one_step_of_a_small_model(capsys):
    assert main(["capture", "tiny-qwen3-moe", "--json", "--dtype", "float32"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["graph_breaks"] == 0 and len(report["graphs"]) == 1 and report["graphs"][0]["phase"] == "joint"


def test_capture_of_a_full_size_model_without_meta_points_to_meta(capsys):
    assert main(["capture", "deepseek-v4-flash"]) == 2
    err = capsys.readouterr().err
    assert "--meta" in err and "GiB" in err


def test_unknown_model_lists_the_valid_names(capsys):
    assert main(["capture", "deepseek-v9", "--meta"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'deepseek-v9'" in err and "deepseek-v4-flash" in err and "qwen3-235b-a22b" in err


def test_demo_trains_and_writes_the_dump_directory(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "trex", "demo", "--steps", "3", "--dump", str(tmp_path / "dump")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    losses = [float(line.split("loss")[1].split()[0]) for line in result.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert f"dump directory: {tmp_path / 'dump'}" in result.stdout
    assert (tmp_path / "dump" / "graph_0_joint" / "001_canonicalize_moe.py").exists()
