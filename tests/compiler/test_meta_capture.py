"""Full-size models are captured on the meta device, one graph per distinct layer kind."""

import json

import pytest
import torch

from trex.errors import CaptureError, TrexError, UnknownNameError
from trex.meta_capture import ENDS, capture_model, decoder_layers
from trex.models import load_config, tiny_config


def test_deepseek_v4_flash_captures_three_layer_kinds_with_counts_and_parameter_totals():
    capture = capture_model("deepseek-v4-flash")
    kinds = {k.name: k for k in capture.kinds}
    assert {name: k.count for name, k in kinds.items() if name != ENDS} == {
        "attention=heavily_compressed_attention, mlp=hash_moe": 3,
        "attention=compressed_sparse_attention, mlp=moe": 20,
        "attention=heavily_compressed_attention, mlp=moe": 20,
    }
    assert capture.num_layers == 43
    assert 280e9 < capture.total_params < 290e9  # ~284B
    assert 12.5e9 < capture.active_params < 14.5e9  # ~13B
    for kind in capture.kinds:
        nodes = kind.node_counts()
        assert nodes["joint"] > nodes["forward"] > 0 and nodes["backward"] > 0
        joint = kind.graph.joint
        assert all(
            p.meta["val"].device.type == "meta"
            for p in joint.graph.find_nodes(op="placeholder")
            if isinstance(p.meta.get("val"), torch.Tensor)
        )
    moe_kind = kinds["attention=compressed_sparse_attention, mlp=moe"]
    gemms = [n for n in moe_kind.graph.joint.graph.nodes if n.target == torch.ops.trex.grouped_mm.default]
    assert len(gemms) == 4 and gemms[0].meta["val"].shape[0] == 4096 * 6  # tokens x top-6 rows
    assert (
        sum(k.params_per_layer * k.count for k in capture.kinds if k.name != ENDS) + kinds[ENDS].params_per_layer
        == capture.total_params
    )


def test_deepseek_v3_separates_dense_and_moe_layers():
    capture = capture_model("deepseek-v3", seq=1024)
    counts = {k.name: k.count for k in capture.kinds if k.name != ENDS}
    assert counts == {"mlp=DeepseekV3MLP": 3, "mlp=DeepseekV3MoE": 58}
    assert 660e9 < capture.total_params < 680e9 and 36e9 < capture.active_params < 39e9


def test_qwen3_235b_has_one_layer_kind():
    capture = capture_model("qwen3-235b-a22b", seq=1024)
    assert [(k.name, k.count) for k in capture.kinds if k.name != ENDS] == [("mlp=Qwen3MoeSparseMoeBlock", 94)]
    assert 230e9 < capture.total_params < 240e9 and 21e9 < capture.active_params < 23e9


@pytest.mark.slow
def test_deepseek_v4_pro_captures_like_flash():
    capture = capture_model("deepseek-v4-pro")
    assert capture.num_layers == 61
    assert 1.5e12 < capture.total_params < 1.65e12 and 47e9 < capture.active_params < 52e9


def test_any_transformers_config_json_path_captures(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_config("deepseek-v3").to_dict()))
    capture = capture_model(path, seq=32)
    assert {k.name: k.count for k in capture.kinds if k.name != ENDS} == {
        "mlp=DeepseekV3MLP": 1,
        "mlp=DeepseekV3MoE": 3,
    }


def test_bad_model_inputs_are_explained(tmp_path):
    with pytest.raises(UnknownNameError, match="deepseek-v4-flash"):
        load_config("deepseek-v5")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(TrexError, match="line 1"):
        load_config(tmp_path / "broken.json")
    (tmp_path / "nomodel.json").write_text("{}")
    with pytest.raises(TrexError, match="model_type"):
        load_config(tmp_path / "nomodel.json")


def test_a_model_without_a_layer_stack_is_refused():
    with pytest.raises(CaptureError, match="no decoder stack"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_capture_does_not_depend_on_what_was_captured_before():
    """Dynamo would mark dimensions dynamic after a second shape; meta capture keeps shapes static."""
    first = capture_model("qwen3-235b-a22b", seq=256)
    capture_model("qwen3-235b-a22b", seq=512)
    again = capture_model("qwen3-235b-a22b", seq=256)
    assert [k.node_counts() for k in again.kinds] == [k.node_counts() for k in first.kinds]
    graph_inputs = again.kinds[0].graph.joint.graph.find_nodes(op="placeholder")
    assert len(graph_inputs) > 0
    missing = [node.name for node in graph_inputs if "val" not in node.meta]
    assert missing == [], f"graph inputs without a FakeTensor value: {missing}"
    values = [node.meta["val"] for node in graph_inputs]
    assert all(isinstance(v, torch.Tensor) for v in values), [
        type(v).__name__ for v in values
    ]  # a dynamic size would come in as a SymInt input
    shapes = [tuple(v.shape) for v in values]
    assert all(type(size) is int for shape in shapes for size in shape), shapes
    assert any(256 in shape for shape in shapes), shapes  # the activations carry the static sequence length
