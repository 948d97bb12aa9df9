"""What a new user meets in their first hour: bad configs get errors they can act on, options that do
nothing say so, the small conveniences work (issue: a user's first hour)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import trex
from trex.cli import main

# -- bad model configs ---------------------------------------------------------------------------------


def _config(tmp_path, data) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


QWEN = {
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}


def test_a_config_that_is_not_an_object_is_named(tmp_path, capsys):
    assert main(["capture", _config(tmp_path, [1, 2, 3])]) == 2
    assert "one JSON object" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_attention_heads", 0), ("hidden_size", -64), ("num_hidden_layers", 0), ("num_experts", -1)],
)
def test_zero_or_negative_sizes_name_the_field_and_value(tmp_path, capsys, field, value):
    assert main(["capture", _config(tmp_path, {**QWEN, field: value})]) == 2
    err = capsys.readouterr().err
    assert f"'{field}' is {value}" in err and "positive integer" in err


def test_an_unknown_model_type_gets_one_line_naming_the_families(tmp_path, capsys):
    assert main(["capture", _config(tmp_path, {**QWEN, "model_type": "qwen9_moe"})]) == 2
    err = capsys.readouterr().err
    assert "qwen9_moe" in err and "deepseek_v4" in err and "qwen3_moe" in err
    assert len(err) < 600, "one line, not transformers' list of every model type"


def test_a_priced_only_model_cannot_be_captured_and_says_what_it_can_do(capsys):
    assert main(["capture", "llama3-70b", "--meta"]) == 2
    err = capsys.readouterr().err
    assert "priced-only" in err and "trex estimate" in err


def test_a_priced_only_config_file_is_estimated(tmp_path, capsys):
    path = _config(
        tmp_path, {"model_type": "gpt", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8}
    )
    assert main(["estimate", "--model", path, "--cluster", "a100", "--devices", "8", "--plan", "tp=8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] > 0


def test_a_dense_model_is_refused_with_the_way_to_capture_it_anyway(tmp_path, capsys):
    dense = {k: v for k, v in QWEN.items() if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")}
    path = _config(tmp_path, {**dense, "model_type": "qwen3"})
    assert main(["capture", path]) == 2
    err = capsys.readouterr().err
    assert "no mixture-of-experts layers" in err and "--allow-dense" in err


# -- options that do nothing, plans that say a thing twice -----------------------------------------------


def test_a_plan_string_naming_a_key_twice_is_an_error(capsys):
    assert (
        main(["estimate", "--model", "gpt-22b", "--cluster", "a100", "--devices", "8", "--plan", "tp=2,pp=2,tp=4"]) == 2
    )
    assert "names tp twice" in capsys.readouterr().err


def test_an_fp8_recipe_at_bf16_says_it_has_no_effect(capsys):
    argv = [
        "estimate",
        "--model",
        "gpt-22b",
        "--cluster",
        "h100",
        "--devices",
        "8",
        "--plan",
        "tp=8",
        "--set",
        "fp8_recipe=tensorwise",
        "--json",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "no effect at precision bf16" in captured.err
    assert any("fp8_recipe" in note for note in json.loads(captured.out)["settings_without_effect"])


def test_estimate_and_plan_share_their_defaults():
    from trex.cli import build_parser

    parser = build_parser()
    estimate = parser.parse_args(["estimate", "--model", "m", "--cluster", "c", "--devices", "8"])
    plan = parser.parse_args(["plan", "--model", "m", "--cluster", "c", "--devices", "8"])
    for option in ("seq", "gbs", "precision"):
        assert getattr(estimate, option) == getattr(plan, option), option


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_help_shows_the_defaults(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "(default 4096)" in out and "(default 1024)" in out


# -- small conveniences -------------------------------------------------------------------------------


def test_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"trex {trex.__version__}"


def test_capture_list_needs_no_model(capsys):
    assert main(["capture", "--list"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v4-flash" in out and "llama3-70b" in out and "priced only" in out


def test_capture_without_a_model_or_list_says_what_to_give(capsys):
    assert main(["capture"]) == 2
    assert "--list" in capsys.readouterr().err


def test_unknown_pass_error_is_spelled_right():
    with pytest.raises(trex.UnknownNameError, match="valid passes:"):
        trex.compile(torch.nn.Linear(2, 2), passes="no_such_pass")


def test_passes_minus_name_removes_one_pass_of_the_default_pipeline():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = trex.compile(model, passes="-dead_code_elimination")
    compiled(torch.randn(2, 4)).sum().backward()
    from trex.passes import DEFAULT_PIPELINE

    ran = [r.name for r in compiled.trex.graphs[0].report.records]
    assert "dead_code_elimination" in DEFAULT_PIPELINE
    assert ran == [name for name in DEFAULT_PIPELINE if name != "dead_code_elimination"]


def test_passes_mixing_minus_and_plain_names_is_an_error():
    with pytest.raises(trex.TrexError, match="mixes"):
        trex.compile(torch.nn.Linear(2, 2), passes="-dead_code_elimination,canonicalize_moe")


class _RaisingSupports(trex.Backend):
    name = "raises_in_supports"

    def supports(self, node):
        raise RuntimeError("my bug")

    def lower(self, gm, example_inputs):
        return gm


def test_a_backend_whose_supports_raises_is_named_in_a_warning():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = trex.compile(model, backend=[_RaisingSupports()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(torch.randn(2, 4)).sum().backward()
    messages = [str(w.message) for w in caught]
    assert any("raises_in_supports" in m and "my bug" in m for m in messages), messages


def test_a_reproducer_replays_a_pass_defined_in_the_users_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        import torch
        import trex

        class Explodes:
            name = "explodes"
            def run(self, gm, ctx):
                raise ValueError("boom from my script")

        print("TRAINING SCRIPT RAN")  # must not run again when the reproducer replays
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        compiled = trex.compile(model, passes=[Explodes()], dump_dir={str(tmp_path / "dump")!r})
        try:
            compiled(torch.randn(2, 4)).sum().backward()
        except trex.PassError:
            sys.exit(3)
    """)
    )
    first = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert first.returncode == 3, first.stderr
    repro = tmp_path / "dump" / "repro_graph_0_joint_explodes" / "repro.py"
    again = subprocess.run(
        [sys.executable, str(repro)], capture_output=True, text=True, timeout=300, cwd=tmp_path / "dump"
    )
    assert again.returncode != 0
    assert "boom from my script" in again.stderr
    assert "TRAINING SCRIPT RAN" not in again.stdout


def test_capture_prints_progress_on_stderr_and_quiet_turns_it_off(capsys):
    assert main(["capture", "tiny-qwen3-moe", "--dtype", "float32"]) == 0
    err = capsys.readouterr().err
    assert "trex capture" in err and "passes done" in err and "lowered" in err
    assert main(["capture", "tiny-qwen3-moe", "--dtype", "float32", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
