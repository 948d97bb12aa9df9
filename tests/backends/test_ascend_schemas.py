"""The Ascend backend's schemas are torch_npu's own, and every emitted call is checked against them."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import trex
from trex.backends.ascend import AscendBackend, AscendSchemaError, check_call, emulation
from trex.backends.ascend.extract_schemas import render, wheel_schemas
from trex.backends.ascend.patterns import Match, Pattern, RmsNorm
from trex.backends.ascend.schemas import DATA_FILE, EMITTED_OPS, YAML_IN_WHEEL, read_data_file, shipped_schemas
from trex.errors import BackendError

WHEEL_CACHE = Path(os.environ.get("TREX_TORCH_NPU_CACHE", Path.home() / ".cache" / "trex" / "torch_npu"))


def _local_wheel() -> Path | None:
    named = os.environ.get("TREX_TORCH_NPU_WHEEL")
    if named:
        return Path(named)
    found = sorted(WHEEL_CACHE.glob("torch_npu-2.13.0-*.whl"))
    return found[0] if found else None


def _check_against(wheel: Path) -> None:
    header, checked_in = read_data_file()
    shipped = wheel_schemas(wheel)
    for op in EMITTED_OPS:
        assert checked_in[op] == shipped[op], f"{op}: the checked-in schema differs from {wheel.name}'s"
    if header.get("wheel") == wheel.name:
        assert render(wheel) == DATA_FILE.read_text(), (
            "data/torch_npu_schemas.txt is not what extract_schemas writes for this wheel"
        )


def test_checked_in_schemas_parse_and_cover_every_emitted_op():
    header, texts = read_data_file()
    assert header["wheel"].startswith("torch_npu-2.13.0-") and len(header["sha256"]) == 64
    schemas = shipped_schemas()
    assert set(EMITTED_OPS) <= set(schemas)
    assert [a.name for a in schemas["npu_rms_norm"].arguments] == ["self", "gamma", "epsilon"]


@pytest.mark.slow
def test_checked_in_schemas_equal_the_downloaded_wheels(tmp_path):
    """Downloads torch_npu 2.13.0 (no deps, ~44 MB; it is not imported) and re-checks the data file."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    if _local_wheel() is None:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "torch_npu==2.13.0", "--no-deps", "-d", str(WHEEL_CACHE)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, f"pip could not download torch_npu 2.13.0: {result.stderr[-300:]}"
    wheel = _local_wheel()
    with zipfile.ZipFile(wheel) as archive:
        assert YAML_IN_WHEEL in archive.namelist()
    _check_against(wheel)


def test_emulated_ops_are_registered_with_the_shipped_schemas():
    for name in emulation.EMULATED:
        registered = getattr(torch.ops.npu_emul, name).default._schema
        shipped = shipped_schemas()[name]
        assert [(a.name, str(a.real_type), a.kwarg_only, str(a.default_value)) for a in registered.arguments] == [
            (a.name, str(a.real_type), a.kwarg_only, str(a.default_value)) for a in shipped.arguments
        ], name
        assert [str(r.real_type) for r in registered.returns] == [str(r.real_type) for r in shipped.returns], name


@pytest.mark.parametrize(
    ("op", "args", "kwargs", "named"),
    [
        ("npu_rms_norm", (torch.ones(2, 4), torch.ones(4)), {"eps": 1e-6}, "'eps'"),
        ("npu_rms_norm", (torch.ones(2, 4),), {}, "'gamma'"),
        ("npu_rms_norm", (torch.ones(2, 4), torch.ones(4)), {"epsilon": "small"}, "'epsilon'"),
        ("npu_swiglu", (torch.ones(2, 4),), {"dim": 1.5}, "'dim'"),
        ("npu_grouped_matmul", ([torch.ones(2, 4)], [torch.ones(1, 4, 4)], None), {}, "keyword-only"),
        ("npu_grouped_matmul", (torch.ones(2, 4), [torch.ones(1, 4, 4)]), {}, "'x'"),
        (
            "npu_moe_token_permute",
            (torch.ones(2, 4), torch.ones(2, 2, dtype=torch.long)),
            {"padded_mode": True},
            "'padded_mode'",
        ),
        (
            "npu_moe_init_routing_v2",
            (torch.ones(2, 4), torch.ones(2, 2, dtype=torch.int32), None),
            {},
            "keyword-only",
        ),
        (
            "npu_moe_init_routing_v2",
            (torch.ones(2, 4), torch.ones(2, 2, dtype=torch.int32)),
            {"active_expert_range": 4},
            "'active_expert_range'",
        ),
        (
            "npu_moe_init_routing_v2",
            (torch.ones(2, 4), torch.ones(2, 2, dtype=torch.int32)),
            {"expert_tokens_num_type": 1, "row_idx_type": 0},
            "'row_idx_type'",
        ),
        ("npu_fusion_attention", (torch.ones(1, 2, 4, 8),) * 3 + (2, "BNSD"), {"scale_value": 0.5}, "'scale_value'"),
        ("npu_fusion_attention_grad", (torch.ones(1, 2, 4, 8),) * 4 + (2, "BNSD", None), {}, "keyword-only"),
        ("npu_moe_gating_top_k", (torch.ones(4, 8), 2), {"norm_type": 1.0}, "'norm_type'"),
        ("npu_moe_gating_top_k", (torch.ones(4, 8),), {"k": 2, "group_num": 2}, "'group_num'"),
        ("npu_no_such_op", (), {}, "npu_no_such_op"),
    ],
)
def test_a_call_that_does_not_fit_the_schema_names_op_and_argument(op, args, kwargs, named):
    allowed = {
        "npu_moe_token_permute": {"padded_mode": [False]},
        "npu_moe_init_routing_v2": {"row_idx_type": [1]},  # what the dispatch lowering allows (trex's perm)
    }.get(op)
    with pytest.raises(AscendSchemaError) as raised:
        check_call(op, args, kwargs, allowed=allowed)
    assert op in str(raised.value) and named in str(raised.value)


def test_a_fitting_call_binds_every_argument_with_defaults():
    bound = check_call("npu_rotary_mul", (torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4)))
    assert bound.arguments["rotary_mode"] == "half" and bound.arguments["rotate"] is None


class _RmsNormWithWrongKeyword(Pattern):
    """Deliberately wrong lowering: passes `eps=` where torch_npu's npu_rms_norm says `epsilon=`."""

    name, op, anchors = "wrong_rms_norm", "npu_rms_norm", RmsNorm.anchors

    def match(self, node):
        good = RmsNorm().match(node)
        if good is None:
            return None
        x, weight = good.nodes[0].args[0], next(a for a in node.args if a is not good.nodes[-2])

        def emit(e, x=x, weight=weight):
            return {node: e.item(e.npu("npu_rms_norm", (x, weight), {"eps": 1e-6}), 0)}

        return Match(self.name, self.op, good.nodes, emit)


class _Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return (self.weight * (x * torch.rsqrt(variance + 1e-6))).sum()


def test_a_deliberately_wrong_lowering_is_caught_at_lowering_time():
    compiled = trex.compile(_Norm(), backend=[AscendBackend(patterns=[_RmsNormWithWrongKeyword()])])
    with pytest.raises(BackendError) as raised:
        compiled(torch.randn(4, 8))
    assert "npu_rms_norm" in str(raised.value) and "'eps'" in str(raised.value)


def test_the_right_lowering_of_the_same_model_runs_and_matches_eager():
    model = _Norm()
    x = torch.randn(4, 8, requires_grad=True)
    compiled = trex.compile(model, backend=["ascend"])
    out = compiled(x)
    out.backward()
    # the forward graph calls npu_rms_norm, the backward graph npu_rms_norm_backward
    assert compiled.trex.lowered_ops() == {"ascend": ["npu_rms_norm", "npu_rms_norm_backward"]}
    grad = x.grad.clone()
    x.grad = None
    expected = model(x)
    expected.backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, x.grad)
