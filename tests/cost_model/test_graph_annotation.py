"""Per-node annotation: hand-counted FLOPs, collectives over the cluster, and real captured graphs
in which every op is priced."""

import dataclasses

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from trex.cost_model import collectives
from trex.cost_model.annotate import annotate
from trex.cost_model.catalog import get_cluster
from trex.cost_model.devices import BUILTIN_DEVICES
from trex.cost_model.model_spec import spec_from_config
from trex.explain import explain


def _graph(fn, *shapes, dtype=torch.float32):
    return make_fx(fn, tracing_mode="fake")(*(torch.randn(s, dtype=dtype) for s in shapes))


def _costs(gm, name):
    return [n.meta["cost"] for n in gm.graph.nodes if "cost" in n.meta and n.meta["cost"].op == name]


def test_a_gemm_is_two_flops_per_multiply_accumulate_and_timed_by_the_tile_model():
    gm = _graph(lambda a, b: a @ b, (512, 1024), (1024, 256), dtype=torch.bfloat16)
    annotate(gm, "h100")
    (cost,) = _costs(gm, "aten.mm")
    assert cost.flops == 2 * 512 * 1024 * 256
    assert cost.bytes == (512 * 1024 + 1024 * 256 + 512 * 256) * 2
    assert cost.time_s == pytest.approx(BUILTIN_DEVICES["h100"].gemm_time(512, 256, 1024, "bf16"))
    assert cost.formula == 2 * sympy.Symbol("M", positive=True, integer=True) * sympy.Symbol(
        "N", positive=True, integer=True
    ) * sympy.Symbol("K", positive=True, integer=True)
    assert cost.bindings["M"] == 512 and "flops = 2*K*M*N" in cost.describe()


def test_batched_gemm_and_causal_attention_hand_counts():
    def fn(q, k):
        scores = torch.bmm(q.flatten(0, 1), k.flatten(0, 1).transpose(1, 2))
        return torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True), scores

    gm = _graph(fn, (2, 4, 64, 32), (2, 4, 64, 32))
    annotate(gm, "a100")
    (bmm,) = _costs(gm, "aten.bmm")
    assert bmm.flops == 2 * 8 * 64 * 64 * 32
    (attention,) = [c for c in (n.meta.get("cost") for n in gm.graph.nodes) if c and c.kind == "attention"]
    # a fused kernel's 128 x 128 blocks: 64 queries are one diagonal block, computed whole (masked inside)
    assert attention.flops == pytest.approx(2 * 2 * 4 * 64 * 64 * (32 + 32))
    # without blocks (CPU profiles): QK^T and PV over the causal half with the diagonal,
    # 2 * B*H * L * (L+1)/2 * (Dqk + Dv)
    a100 = BUILTIN_DEVICES["a100"]
    annotate(gm, dataclasses.replace(a100, attention=dataclasses.replace(a100.attention, block=0)))
    (attention,) = [c for c in (n.meta.get("cost") for n in gm.graph.nodes) if c and c.kind == "attention"]
    assert attention.flops == pytest.approx(2 * 2 * 4 * 64 * (64 + 1) / 2 * (32 + 32))


def test_pointwise_reduction_and_views_follow_their_formulas():
    gm = _graph(lambda x: (torch.exp(x) + 1).sum(dim=-1).view(-1), (8, 128))
    report = annotate(gm, "h100")
    (exp,) = _costs(gm, "aten.exp")
    assert exp.flops == 4 * 8 * 128 and exp.bytes == 2 * 8 * 128 * 4
    (total,) = _costs(gm, "aten.sum")
    assert total.flops == 8 * 128
    (view,) = _costs(gm, "aten.view")
    assert view.kind == "view" and view.time_s == 0 and view.bytes == 0
    assert report.unpriced == {}


def test_collectives_are_priced_over_the_cluster_group():
    def fn(x):
        reduced = torch.ops._c10d_functional.all_reduce.default(x, "sum", "tp")
        gathered = torch.ops._c10d_functional.all_gather_into_tensor.default(x, 8, "dp")
        return torch.ops._c10d_functional.wait_tensor.default(reduced), torch.ops._c10d_functional.wait_tensor.default(
            gathered
        )

    gm = _graph(fn, (1024, 1024), dtype=torch.bfloat16)
    cluster = get_cluster("h100", 64)
    annotate(gm, cluster, groups={"tp": range(8), "dp": range(0, 64, 8)})
    (reduce,) = _costs(gm, "_c10d_functional.all_reduce")
    assert reduce.time_s == pytest.approx(collectives.all_reduce(2 * 1024 * 1024, cluster.placement(range(8))))
    (gather,) = _costs(gm, "_c10d_functional.all_gather_into_tensor")
    assert gather.time_s == pytest.approx(
        collectives.all_gather(8 * 2 * 1024 * 1024, cluster.placement(range(0, 64, 8)))
    )
    assert all(c.time_s == 0 and c.kind == "sync" for c in _costs(gm, "_c10d_functional.wait_tensor"))


def test_a_collective_with_an_unknown_group_is_reported_not_priced_at_zero():
    gm = _graph(lambda x: torch.ops._c10d_functional.all_reduce.default(x, "sum", "mystery"), (16,))
    report = annotate(gm, "h100")
    assert report.unpriced == {"_c10d_functional.all_reduce": 1}
    (cost,) = _costs(gm, "_c10d_functional.all_reduce")
    assert not cost.priced and "group size unknown" in cost.note


def test_an_op_without_a_formula_is_reported_by_name(capsys):
    gm = _graph(lambda x: torch.linalg.cholesky(x @ x.T + torch.eye(8)), (8, 8))
    explanation = explain(gm, target="h100")
    assert explanation.report.unpriced == {"aten.linalg_cholesky_ex": 1, "aten._linalg_check_errors": 1}
    assert "unpriced ops (no formula, not counted): aten.linalg_cholesky_ex (x1)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Real graphs captured by trex.compile (joint forward + backward, MoE canonicalised)


def _capture(family):
    import trex
    from trex.models import build_model, tiny_config

    config = tiny_config(family)
    compiled = trex.compile(build_model(config), backend="eager")  # the canonical graph, not a CPU lowering
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    compiled(input_ids=ids, labels=ids)
    (joint,) = [g.joint for g in compiled.trex.graphs if g.joint is not None]
    return config, joint


@pytest.fixture(scope="module")
def qwen3_moe():
    return _capture("qwen3-moe")


def test_every_node_of_a_captured_qwen3_moe_graph_is_priced(qwen3_moe):
    _, joint = qwen3_moe
    report = annotate(joint, "h100")
    assert report.unpriced == {}
    calls = [n for n in joint.graph.nodes if n.op == "call_function"]
    assert all("cost" in n.meta for n in calls) and report.priced == len(calls)
    assert {"trex.grouped_mm", "trex.moe_dispatch", "trex.moe_combine", "trex.grouped_mm_weight_grad"} <= set(
        report.count_by_op
    )


def test_captured_gemm_flops_equal_three_times_the_model_spec_forward(qwen3_moe):
    config, joint = qwen3_moe
    annotate(joint, "h100")
    gemm = sum(n.meta["cost"].flops for n in joint.graph.nodes if "cost" in n.meta and n.meta["cost"].kind == "gemm")
    spec, tokens = spec_from_config(config), 2 * 16
    forward = (
        sum(
            tokens * sum(lin.flops_per_token for lin in layer.linears)
            + (tokens * layer.moe.expert_flops_per_token(spec.hidden_size) if layer.moe else 0)
            for layer in spec.layers
        )
        + 2 * tokens * spec.hidden_size * spec.vocab_size
    )
    assert gemm == pytest.approx(3 * forward)  # forward, data gradient, weight gradient


def test_grouped_mm_nodes_cost_two_s_k_n(qwen3_moe):
    _, joint = qwen3_moe
    annotate(joint, "h100")
    for node in joint.graph.nodes:
        if (
            node.op == "call_function"
            and "grouped_mm.default" in str(node.target)
            and "weight_grad" not in str(node.target)
        ):
            rows, k = node.args[0].meta["val"].shape
            n = node.args[1].meta["val"].shape[-1]
            assert node.meta["cost"].flops == 2 * rows * k * n


def test_decompose_moes_extern_grouped_gemms_are_priced_like_the_primitives():
    """decompose_moe (when Inductor leads) turns fp32 grouped GEMMs into trex.extern_grouped_mm(_weight_grad):
    the same kernels, so the same FLOPs and time as trex.grouped_mm(_weight_grad)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    import trex.ops.moe_decompositions  # noqa: F401 - registers the extern ops

    x, w, dy = torch.randn(96, 32), torch.randn(4, 32, 48), torch.randn(96, 48)
    offsets = torch.tensor([10, 40, 70, 96], dtype=torch.int32)

    def both(op_fwd, op_wgrad):
        return lambda x, w, dy, o: (op_fwd(x, w, o), op_wgrad(x, dy, o))

    costs = {}
    for label, fwd, wgrad in (
        ("primitive", torch.ops.trex.grouped_mm.default, torch.ops.trex.grouped_mm_weight_grad.default),
        ("extern", torch.ops.trex.extern_grouped_mm.default, torch.ops.trex.extern_grouped_mm_weight_grad.default),
    ):
        gm = make_fx(both(fwd, wgrad), tracing_mode="fake")(x, w, dy, offsets)
        annotate(gm, "h100")
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        assert all(n.meta["cost"].priced for n in nodes), [(n.target, n.meta["cost"].note) for n in nodes]
        costs[label] = [(n.meta["cost"].flops, n.meta["cost"].time_s) for n in nodes]
    assert costs["extern"] == costs["primitive"]
    assert costs["extern"][0][0] == 2 * 96 * 32 * 48


def test_explain_prints_the_per_op_table_and_totals(qwen3_moe, capsys):
    _, joint = qwen3_moe
    explanation = explain(joint, target="h100")
    out = capsys.readouterr().out
    assert "trex.grouped_mm" in out and "total:" in out and "by kind:" in out
    assert explanation.rows()[0]["time_s"] >= explanation.rows()[-1]["time_s"]


def test_explain_captures_a_model_itself(capsys):
    from trex.models import build_model, tiny_config

    config = tiny_config("qwen3-moe", num_layers=1)
    ids = torch.randint(0, config.vocab_size, (1, 8))
    explanation = explain(build_model(config), {"input_ids": ids, "labels": ids}, target="a100")
    assert explanation.report.unpriced == {} and explanation.report.total_flops > 0
    assert "estimated cost per op on a100" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["deepseek-v3", "deepseek-v4"])
def test_every_node_of_captured_deepseek_graphs_is_priced(family):
    _, joint = _capture(family)
    report = annotate(joint, "cloudmatrix384")
    assert report.unpriced == {}
    assert report.total_flops > 0 and report.priced == sum(1 for n in joint.graph.nodes if n.op == "call_function")
