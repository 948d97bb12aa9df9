"""trex.compile trains the three real MoE families like eager: one graph, no breaks, same numbers."""

import copy
from collections import Counter

import pytest
import torch

import trex
from trex.models import build_model, tiny_config
from trex.testing import TOLERANCES

FAMILIES = ["deepseek-v4", "deepseek-v3", "qwen3-moe"]
# bf16 compares the compiled model with eager bf16; both round differently in a few reductions.
GRAD_TOLERANCE = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (5e-2, 2e-2)}


def _batch(config, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (2, 16), generator=generator)


def _moe_layers(config):
    if hasattr(config, "mlp_layer_types"):  # DeepSeek-V4: every layer is MoE (hash or routed)
        return config.num_hidden_layers
    if hasattr(config, "first_k_dense_replace"):  # DeepSeek-V3: the first k layers are dense
        return config.num_hidden_layers - config.first_k_dense_replace
    return config.num_hidden_layers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_three_adamw_steps_match_eager(family, dtype):
    config = tiny_config(family)
    model = build_model(config, dtype=dtype, seed=1)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    input_ids = _batch(config)
    rtol, atol = GRAD_TOLERANCE[dtype]

    for step in range(3):
        loss = compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
        expected = reference(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        expected.backward()
        torch.testing.assert_close(
            loss,
            expected,
            rtol=TOLERANCES[dtype][0] * 10,
            atol=1e-5 if dtype == torch.float32 else 1e-2,
            msg=lambda m: f"step {step} loss: {m}",
        )
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert (p.grad is None) == (q.grad is None), f"step {step}: {name} has a gradient in only one of trex/eager"
            if p.grad is not None:
                torch.testing.assert_close(
                    p.grad, q.grad, rtol=rtol, atol=atol, msg=lambda m, n=name: f"step {step} grad of {n}: {m}"
                )
        optimizer.step()
        reference_optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        reference_optimizer.zero_grad(set_to_none=True)

    session = compiled.trex
    assert len(session.graphs) == 1 and session.graph_breaks == []
    assert session.graphs[0].phase == "joint"
    # one fused MoE op per MoE layer was captured, and canonicalization made its GEMMs visible
    captured = Counter(str(n.target) for n in session.graphs[0].dynamo_graph.graph.nodes)
    assert sum(v for k, v in captured.items() if "moe_experts" in k) == _moe_layers(config)
    joint = Counter(n.target for n in session.graphs[0].joint.graph.nodes)
    assert joint[torch.ops.trex.moe_experts.default] == joint[torch.ops.trex.moe_experts_backward.default] == 0
    assert joint[torch.ops.trex.grouped_mm.default] == 4 * _moe_layers(config)  # 2 forward + 2 input-grad
    assert joint[torch.ops.trex.grouped_mm_weight_grad.default] == 2 * _moe_layers(config)


def test_every_node_of_the_joint_graph_carries_fake_tensor_metadata():
    from torch._subclasses.fake_tensor import FakeTensor

    config = tiny_config("qwen3-moe", num_layers=2)
    compiled = trex.compile(build_model(config))
    input_ids = _batch(config)
    compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss.backward()
    joint = compiled.trex.graphs[0].joint
    for node in joint.graph.nodes:
        if node.op == "output":
            continue
        values = node.meta["val"] if isinstance(node.meta["val"], (tuple, list)) else [node.meta["val"]]
        assert all(isinstance(v, (FakeTensor, int, float, bool, torch.SymInt)) or v is None for v in values), (
            node.format_node()
        )
    assert any(n.name.startswith("tangents") for n in joint.graph.find_nodes(op="placeholder")), (
        "the joint graph holds the backward"
    )


def test_inference_under_no_grad_runs_the_pipeline_on_a_forward_graph():
    config = tiny_config("deepseek-v3", num_layers=2)
    model = build_model(config)
    compiled = trex.compile(model)
    input_ids = _batch(config)
    with torch.no_grad():
        logits = compiled(input_ids=input_ids, use_cache=False).logits
        expected = model(input_ids=input_ids, use_cache=False).logits
    torch.testing.assert_close(logits, expected)
    graph = compiled.trex.graphs[0]
    assert graph.phase == "inference" and graph.backward is None
    from trex.passes import DEFAULT_PIPELINE

    assert [r.name for r in graph.report.records if r.ran] == list(DEFAULT_PIPELINE)
    assert not any(n.target == torch.ops.trex.moe_experts.default for n in graph.joint.graph.nodes)


def test_compiled_module_shares_parameters_and_forwards_attributes():
    config = tiny_config("qwen3-moe", num_layers=2)
    model = build_model(config)
    compiled = trex.compile(model)
    assert compiled.config is model.config
    assert list(compiled.parameters()) == list(model.parameters())
    assert set(compiled.state_dict()) == {f"_orig_mod.{k}" for k in model.state_dict()}
    assert compiled.trex.previous_experts_implementation == "grouped_mm"
    assert set(compiled.trex.experts_coverage.values()) == {None}


def test_torch_compile_backend_trex_is_found_through_the_entry_point():
    config = tiny_config("qwen3-moe", num_layers=2)
    model = build_model(config)
    compiled = torch.compile(model, backend="trex", fullgraph=True)
    input_ids = _batch(config)
    loss = compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    loss.backward()
    expected = build_model(config)(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    torch.testing.assert_close(loss, expected)
    assert all(p.grad is not None for p in model.model.layers[0].mlp.experts.parameters())
