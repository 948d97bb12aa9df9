"""The Inductor backend: trex's regions compiled by Inductor train like eager, in as few regions as
possible, and the user picks and orders backends with `backend=` or TREX_BACKENDS."""

from __future__ import annotations

import copy

import pytest
import torch

import trex
from trex.backends import backend_names_from_env, default_backend_names
from trex.backends.inductor import inductor_unavailable_reason
from trex.driver import CompileOptions
from trex.errors import UnknownNameError

needs_inductor = pytest.mark.skipif(
    inductor_unavailable_reason() is not None, reason=str(inductor_unavailable_reason())
)


class TinyBlock(torch.nn.Module):
    """RMSNorm + SwiGLU MLP + a trex MoE layer: pointwise, reductions, GEMMs and the trex ops."""

    def __init__(self, hidden=16, experts=4):
        super().__init__()
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-6)
        self.up = torch.nn.Linear(hidden, 2 * hidden, bias=False)
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * hidden, hidden) * hidden**-0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, hidden) * hidden**-0.5)

    def forward(self, x):
        gate, up = self.up(self.norm(x)).chunk(2, dim=-1)
        x = x + torch.nn.functional.silu(gate) * up
        weights, index = torch.topk(torch.softmax(self.router(x), -1), 2, dim=-1)
        x = x + torch.ops.trex.moe_experts(x, index, weights, self.gate_up, self.down, "silu", 0.0, False)[0]
        return (x * x).mean()


@needs_inductor
def test_inductor_takes_forward_and_backward_as_one_region_each_and_matches_eager():
    torch.manual_seed(0)
    model, x = TinyBlock(), torch.randn(12, 16)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=["inductor", "eager"])
    loss = compiled(x)
    loss.backward()
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)

    graph = compiled.trex.graphs[0]
    for which in ("forward", "backward"):
        lowering = graph.lowerings[which]
        assert [p[0] for p in lowering.partitions] == ["inductor"], f"{which}: {lowering.describe()}"
        assert set(lowering.assignment.values()) == {"inductor"}  # the trex MoE primitives too, as extern calls
        assert all(seconds > 0 for seconds in lowering.region_seconds.values())
        assert lowering.predicted_seconds["inductor"] > 0
        assert lowering.boxed is not None  # one region: called with AOTAutograd's list, inputs freed early
    summary = compiled.trex.summary()
    assert "forward: inductor" in summary and "ms predicted" in summary and "region(s) compiled in" in summary


def test_trex_backends_environment_orders_the_backends(monkeypatch):
    monkeypatch.setenv("TREX_BACKENDS", "eager")
    options = CompileOptions.build()
    assert [b.name for b in options.backends] == ["eager"]
    monkeypatch.setenv("TREX_BACKENDS", "inductor, eager")
    assert backend_names_from_env(dict(TREX_BACKENDS="inductor, eager")) == ["inductor", "eager"]
    assert [b.name for b in CompileOptions.build().backends] == ["inductor", "eager"]
    # an explicit backend= wins over the environment
    assert [b.name for b in CompileOptions.build(backend="eager").backends] == ["eager"]


def test_trex_backends_environment_names_an_unknown_backend(monkeypatch):
    monkeypatch.setenv("TREX_BACKENDS", "inductor,tritonn")
    with pytest.raises(UnknownNameError, match="tritonn.*TREX_BACKENDS"):
        CompileOptions.build()


def test_default_backends_are_inductor_then_eager_where_inductor_works(monkeypatch):
    monkeypatch.delenv("TREX_BACKENDS")
    expected = ["eager"] if inductor_unavailable_reason() is not None else ["inductor", "eager"]
    assert default_backend_names() == expected
    assert [b.name for b in CompileOptions.build().backends] == expected


@needs_inductor
def test_inductor_declines_nodes_on_devices_it_has_no_code_generator_for():
    from trex.backends.inductor import InductorBackend

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(torch.ops.aten.relu.default, (x,))
    node.meta["val"] = torch.empty(2, device="meta")
    assert not InductorBackend().supports(node)
    node.meta["val"] = torch.empty(2)
    assert InductorBackend().supports(node)


@needs_inductor
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["deepseek-v4", "deepseek-v3", "qwen3-moe"])
def test_tiny_models_train_like_eager_through_inductor(family, dtype, step_matches_eager):
    from trex.models import build_model, tiny_config

    config = tiny_config(family)
    model = build_model(config, dtype=dtype, seed=1)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=["inductor", "eager"])
    # bf16: trex (fp32 GEMMs, its own sum orders) and eager are each judged against the same step in fp32
    step_matches_eager(compiled, model, reference, config, dtype, fp32_reference=True)
    lowering = compiled.trex.graphs[0].lowerings
    assert len(lowering["forward"].partitions) == 1 and len(lowering["backward"].partitions) == 1


@needs_inductor
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_inductor_rounds_where_eager_rounds_in_low_precision_graphs(dtype, monkeypatch):
    """A bf16 graph is compiled with Inductor's `emulate_precision_casts` (each value rounded to its dtype as
    eager rounds it: without it tiny V4's bf16 sinks gradient was 3.2x eager's distance from fp32, see
    `backends.inductor.backend._eager_roundings`); an fp32 graph is compiled with Inductor's own setting."""
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.config as inductor_config

    seen = []

    def by_fx(gm, example_inputs, **kwargs):  # records the setting and runs the graph op by op
        seen.append(inductor_config.emulate_precision_casts)

        def run(args):
            values = list(args)
            args.clear()
            return list(gm(*values))

        return run

    monkeypatch.setattr(compile_fx, "compile_fx_inner", by_fx)
    default = inductor_config.emulate_precision_casts
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Softmax(-1)).to(dtype)
    compiled = trex.compile(copy.deepcopy(model), backend=["inductor", "eager"])
    x = torch.randn(4, 8, dtype=dtype)
    compiled(x).sum().backward()
    assert seen == [dtype == torch.bfloat16 or default] * 2  # forward and backward
    assert inductor_config.emulate_precision_casts == default  # only for the compile
