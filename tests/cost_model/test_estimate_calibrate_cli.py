"""`trex estimate` and `trex calibrate` from the command line."""

import json

import pytest

from trex.cli import main
from trex.cost_model.trace import validate_trace


def test_estimate_json_has_the_promised_fields(capsys):
    code = main(
        [
            "estimate",
            "--model",
            "gpt-175b",
            "--cluster",
            "a100",
            "--devices",
            "64",
            "--plan",
            "tp=8,pp=8,vpp=3",
            "--seq",
            "2048",
            "--gbs",
            "64",
            "--recompute",
            "selective",
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    for key in (
        "step_time_s",
        "tokens_per_s_per_device",
        "model_tflops_per_device",
        "mfu",
        "mfu_6n",
        "memory_per_device_gib",
        "flops_per_token",
    ):
        assert data[key] > 0
    assert set(data["breakdown"]) >= {"compute", "exposed_communication", "bubble", "optimizer"}
    assert data["plan"]["dp"] == 1 and data["feasible"] is True


def test_estimate_prints_a_table_and_writes_a_trace(capsys, tmp_path):
    trace = tmp_path / "step.json"
    code = main(
        [
            "estimate",
            "--model",
            "qwen3-235b-a22b",
            "--cluster",
            "h100",
            "--devices",
            "256",
            "--plan",
            "tp=2,pp=8,vpp=4,ep=32",
            "--seq",
            "4096",
            "--gbs",
            "2048",
            "--set",
            "dispatcher=deepep",
            "--trace",
            str(trace),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "MFU (Megatron per-GEMM)" in out and "memory total" in out and "ui.perfetto.dev" in out
    assert validate_trace(json.loads(trace.read_text())) == []


def test_layers_show_every_layer_kind_op_by_op(capsys):
    argv = [
        "estimate",
        "--model",
        "deepseek-v3",
        "--cluster",
        "h100",
        "--devices",
        "1024",
        "--plan",
        "tp=2,pp=8,vpp=4,ep=64,zero=1",
        "--seq",
        "4096",
        "--gbs",
        "8192",
        "--precision",
        "fp8",
        "--recompute",
        "selective:mla_up_proj+mlp",
        "--layers",
    ]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    layers = data["layers"]
    assert {kind: layer["count"] for kind, layer in layers.items()} == {"dense": 3, "moe": 58, "mtp": 1}
    moe = layers["moe"]
    names = {op["name"] for op in moe["ops"]}
    assert {"experts.grouped_mm", "moe.dispatch+combine", "attention"} <= names
    # the ops add up to the layer: compute plus the communication it leaves exposed
    assert sum(op["forward_s"] for op in moe["ops"]) == pytest.approx(moe["forward_s"] + moe["exposed_comm_forward_s"])
    assert sum(op["backward_s"] for op in moe["ops"]) == pytest.approx(
        moe["backward_s"] + moe["exposed_comm_backward_s"]
    )
    assert sum(op["recompute_s"] for op in moe["ops"]) == pytest.approx(moe["recompute_s"])
    experts = next(op for op in moe["ops"] if op["name"] == "experts.grouped_mm")
    assert 0 < experts["tflops"] < 1979  # below the H100's dense FP8 peak
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "layer moe (x58 in the model)" in out and "experts.grouped_mm" in out and "exposed communication" in out
    assert "pipeline: 8 devices x 4 chunks" in out and "+E" in out and "+H" in out


def test_an_inconsistent_plan_is_data_under_json(capsys):
    code = main(
        [
            "estimate",
            "--model",
            "deepseek-v3",
            "--cluster",
            "h100",
            "--devices",
            "1024",
            "--plan",
            "tp=2,pp=8,ep=7,dp=32",
            "--json",
        ]
    )
    assert code == 1
    data = json.loads(capsys.readouterr().out)
    assert data["feasible"] is False
    assert "tp*pp*cp*dp = 2*8*1*32 = 512 differs from the 1024 devices" in data["violations"]
    assert "ep=7 does not divide the 256 experts" in data["violations"]


def test_an_inconsistent_plan_is_an_error_without_json(capsys):
    assert main(["estimate", "--model", "gpt-22b", "--cluster", "a100", "--devices", "8", "--plan", "tp=16"]) == 2
    assert "tp*pp*cp = 16*1*1 = 16 does not divide the 8 devices" in capsys.readouterr().err


def test_unknown_names_list_the_valid_ones(capsys):
    assert main(["estimate", "--model", "gpt-175b", "--cluster", "tpu", "--devices", "8"]) == 2
    err = capsys.readouterr().err
    assert "unknown cluster 'tpu'" in err and "cloudmatrix384" in err and "ascend-910b" in err
    assert main(["estimate", "--model", "llama-9000", "--cluster", "h100", "--devices", "8"]) == 2
    assert "unknown model 'llama-9000'" in capsys.readouterr().err


def test_a_plan_over_memory_is_reported_with_its_shortfall(capsys):
    code = main(
        [
            "estimate",
            "--model",
            "gpt-1t",
            "--cluster",
            "a100",
            "--devices",
            "8",
            "--plan",
            "tp=8",
            "--gbs",
            "8",
            "--json",
        ]
    )
    assert code == 1
    data = json.loads(capsys.readouterr().out)
    assert data["feasible"] is False and "exceeds the 77.0 GiB usable on a100" in data["violations"][0]


def test_set_rejects_unknown_fields(capsys):
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
                "--set",
                "turbo=1",
            ]
        )
        == 2
    )
    assert "unknown plan field 'turbo'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "sets, message",
    [
        (["tp=4"], 'tp is set with --plan (e.g. --plan "tp=4")'),  # --plan says tp=8: never silently overridden
        (["seq=4"], "seq is set with --seq"),
        (["dispatcher=deepep", "dispatcher=alltoall"], "given twice"),
        (["dispatcher=DeepEP"], "dispatcher='DeepEP': use one of alltoall, deepep"),
    ],
)
def test_set_never_silently_overrides_or_guesses(capsys, sets, message):
    argv = ["estimate", "--model", "gpt-22b", "--cluster", "a100", "--devices", "8", "--plan", "tp=8"]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_calibrate_writes_a_profile_that_estimate_can_use(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TREX_CACHE_DIR", str(tmp_path))
    assert main(["calibrate", "--fast", "--no-collectives", "--threads", "1"]) == 0
    assert "saved to" in capsys.readouterr().out and (tmp_path / "cpu.toml").exists()
    assert main(
        [
            "estimate",
            "--model",
            "gpt-22b",
            "--cluster",
            "a100",
            "--device",
            str(tmp_path / "cpu.toml"),
            "--devices",
            "8",
            "--plan",
            "tp=8",
            "--gbs",
            "4",
            "--precision",
            "fp32",
            "--json",
        ]
    ) in (0, 1)
    assert json.loads(capsys.readouterr().out)["device"] == "cpu"
