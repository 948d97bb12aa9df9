"""Graph-side pricing (annotate -> node.meta["cost"]) and spec-side pricing (layer_cost) agree on every layer
kind of the tiny models and of one full-size layer kind: matmul FLOPs and GEMM operand bytes within 2%,
class by class (trex.cost_model.agreement says what is compared and why)."""

from dataclasses import replace

import pytest

from trex.cost_model.agreement import compare_layer, comparison_plan, parameter_inputs
from trex.cost_model.annotate import annotate
from trex.cost_model.model_spec import get_model_spec, spec_from_config
from trex.meta_capture import capture_model
from trex.models import tiny_config

SEQ = 64


def _agreements(config, spec, seq):
    capture = capture_model(config, seq=seq, include_ends=False)
    out = {}
    for kind in capture.kinds:
        graph = kind.graph
        annotate(graph.joint, "h100")
        layer = spec.layers[kind.layer_indices[0]]
        parameters = parameter_inputs(graph.joint, graph.dynamo_graph)
        plan = comparison_plan(seq, capture.batch)
        name = f"{spec.name} {layer.kind}"
        out[layer.kind] = compare_layer(graph.joint, parameters, layer, spec.hidden_size, plan, name=name)
    return out, capture


@pytest.fixture(scope="module")
def qwen3_tiny():
    config = tiny_config("qwen3-moe")
    return _agreements(config, spec_from_config(config, "qwen3-moe"), SEQ)


def _assert_agree(agreements):
    for agreement in agreements.values():
        assert agreement.disagreements() == [], agreement.describe()
        for totals in agreement.classes.values():  # the compared classes are not empty on either side
            assert (totals.graph_flops > 0) == (totals.spec_flops > 0)


def test_tiny_qwen3_moe_layer_agrees(qwen3_tiny):
    agreements, _ = qwen3_tiny
    assert set(agreements) == {"moe"}
    _assert_agree(agreements)
    moe = agreements["moe"]
    assert all(moe.classes[c].spec_flops > 0 for c in ("gemm", "moe_gemm", "attention"))
    # the fused QKV of the spec is three projections in the graph: named, and equal in sum
    graph_only, spec_only = moe.differing("gemm", "bytes")
    assert {p.name for p in spec_only} == {"qkv_proj"}
    assert {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"} <= {p.name for p in graph_only}


def test_a_wrong_spec_is_caught_and_the_differing_op_named(qwen3_tiny):
    agreements, capture = qwen3_tiny
    (kind,) = capture.kinds
    spec = spec_from_config(tiny_config("qwen3-moe"), "qwen3-moe")
    layer = spec.layers[kind.layer_indices[0]]
    broken = replace(layer, linears=tuple(lin for lin in layer.linears if lin.name != "o_proj"))
    joint = kind.graph.joint
    parameters = parameter_inputs(joint, kind.graph.dynamo_graph)
    agreement = compare_layer(joint, parameters, broken, spec.hidden_size, comparison_plan(SEQ))
    (line,) = [line for line in agreement.disagreements() if "gemm FLOPs" in line]
    graph_only = line.split("graph only:")[1].split("spec only:")[0]
    assert "self_attn.o_proj" in graph_only
    # pricing the eager graph's attention as a fused causal kernel is not like with like: it is caught
    fused = compare_layer(joint, parameters, layer, spec.hidden_size, comparison_plan(SEQ, 1, "flash"))
    assert any("attention FLOPs" in line for line in fused.disagreements())


def test_tiny_deepseek_v3_dense_and_moe_layers_agree():
    config = tiny_config("deepseek-v3")
    agreements, _ = _agreements(config, spec_from_config(config, "deepseek-v3"), SEQ)
    assert set(agreements) == {"dense", "moe"}
    _assert_agree(agreements)
    assert agreements["dense"].classes["moe_gemm"].graph_flops == 0


@pytest.mark.slow
def test_tiny_deepseek_v4_layer_kinds_agree_but_for_the_indexer_scorers_bytes():
    config = tiny_config("deepseek-v4")
    agreements, _ = _agreements(config, spec_from_config(config, "deepseek-v4"), SEQ)
    assert set(agreements) == {"hca+hash_moe", "csa+moe", "hca+moe"}
    _assert_agree({k: a for k, a in agreements.items() if k != "csa+moe"})
    # transformers' indexer scorer runs per token in fp32 (keys broadcast over every query), the spec prices a
    # bf16 score GEMM over heads: the one known difference, named
    (line,) = agreements["csa+moe"].disagreements()
    assert "attention bytes" in line and "spec only: indexer" in line
    assert "graph only: self_attn.compressor.indexer.scorer" in line


def test_full_size_qwen3_235b_layer_agrees():
    agreements, capture = _agreements("qwen3-235b-a22b", get_model_spec("qwen3-235b-a22b"), 256)
    assert len(capture.kinds) == 1 and capture.kinds[0].graph.joint is not None
    _assert_agree(agreements)


def test_unfused_attention_computes_the_whole_square_whatever_the_mask():
    from trex.cost_model.catalog import get_cluster
    from trex.cost_model.layer_cost import CostContext, LayerCost, _attention
    from trex.cost_model.model_spec import AttentionCore

    plan = comparison_plan(1024)
    windowed = AttentionCore("attention", 8, 1, 64, 64, window=128, compress_rate=4)
    cost = LayerCost()
    _attention(windowed, CostContext.of(plan, get_cluster("h100")), cost, recompute=False)
    forward = 2.0 * 1024 * 8 * (1024 + 1024 // 4) * (64 + 64)  # the whole square, plus every compressed entry
    assert cost.flops == pytest.approx(3 * forward)  # QK^T, PV and their two gradient GEMMs each: no recompute of S
    flash = LayerCost()
    _attention(windowed, CostContext.of(comparison_plan(1024, 1, "flash"), get_cluster("h100")), flash, recompute=False)
    assert flash.flops < cost.flops / 4  # a kernel that skips masked blocks
    scores_only = replace(windowed, v_head_dim=0, window=0, backward=False)  # DeepSeek-V4's indexer: forward only
    indexer = LayerCost()
    _attention(scores_only, CostContext.of(plan, get_cluster("h100")), indexer, recompute=False)
    assert indexer.flops == pytest.approx(2.0 * 1024 * 8 * (1024 // 4) * 64) and indexer.backward_s == 0


def test_fused_causal_attention_counts_the_same_blocks_on_both_sides():
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from trex.cost_model.catalog import get_cluster
    from trex.cost_model.layer_cost import CostContext, LayerCost, _attention
    from trex.cost_model.model_spec import AttentionCore

    seq = 640  # five 128-key blocks: the diagonal ones are computed whole
    shape = (1, 4, seq, 32)
    gm = make_fx(
        lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), tracing_mode="fake"
    )(*(torch.randn(shape, dtype=torch.bfloat16) for _ in range(3)))
    annotate(gm, "h100")
    (graph,) = [n.meta["cost"] for n in gm.graph.nodes if "cost" in n.meta and n.meta["cost"].kind == "attention"]
    spec = LayerCost()
    ctx = CostContext.of(comparison_plan(seq, 1, "flash"), get_cluster("h100"))
    _attention(AttentionCore("attention", 4, 4, 32, 32), ctx, spec, recompute=False)
    assert spec.flops == pytest.approx(graph.flops * 3.5)  # forward + the fused backward's 2.5x
    assert graph.flops == pytest.approx(2 * 4 * seq * (seq + 128) / 2 * 64)  # (L + block) / 2 keys per query
