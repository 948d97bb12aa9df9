"""Regional compilation in the Inductor backend: a graph's repeated decoder layers are compiled once and
the compiled code is reused for the identical ones, with loss and gradients equal to eager and to the
whole-graph compile."""

from __future__ import annotations

import copy

import pytest
import torch

import trex
from trex.backends.inductor import InductorBackend, inductor_unavailable_reason
from trex.backends.inductor.regions import layer_of

needs_inductor = pytest.mark.skipif(
    inductor_unavailable_reason() is not None, reason=str(inductor_unavailable_reason())
)


class Layer(torch.nn.Module):
    def __init__(self, hidden, experts=4):
        super().__init__()
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-6)
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * hidden, hidden) * hidden**-0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, hidden) * hidden**-0.5)

    def forward(self, x):
        h = self.norm(x)
        weights, index = torch.topk(torch.softmax(self.router(h), -1), 2, dim=-1)
        return x + torch.ops.trex.moe_experts(h, index, weights, self.gate_up, self.down, "silu", 0.0, False)[0]


class Stack(torch.nn.Module):
    """Five identical MoE layers between an input projection and a head (as a decoder's layers sit between
    its embedding and its head); `wide_last` makes the last layer's weights another shape. The first and
    the last layer's regions differ from the middle ones (the backward recomputes a layer's output inside
    the next layer's backward; the first layer's input is the projection's), so layers 1-3 share code."""

    def __init__(self, hidden=16, wide_last=False):
        super().__init__()
        self.embed = torch.nn.Linear(8, hidden)
        self.layers = torch.nn.ModuleList(Layer(hidden) for _ in range(5))
        if wide_last:
            self.layers[4] = Layer(hidden, experts=6)
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x).square().mean()


def _train_step(backend, model, x):
    compiled = trex.compile(model, backend=[backend, "eager"])
    loss = compiled(x)
    loss.backward()
    return compiled, loss


@needs_inductor
def test_repeated_layers_compile_once_and_train_like_eager():
    torch.manual_seed(0)
    model, x = Stack(), torch.randn(12, 8)
    reference = copy.deepcopy(model)
    compiled, loss = _train_step(InductorBackend(regional=True), model, x)
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"grad of {n}: {m}")
    for which in ("forward", "backward"):
        notes = compiled.trex.graphs[0].lowerings[which].notes
        (header,) = [n for n in notes if "regional compilation" in n]
        reused = [n for n in notes if "reuses an identical region" in n]
        assert len(reused) >= 2, f"{which}: {notes}"  # layers 2 and 3 run layer 1's code
        assert all("layer" in n for n in reused)


@needs_inductor
@pytest.mark.slow  # a full Inductor compile of the toy stack; the default run has the one above
def test_a_layer_of_another_shape_gets_its_own_compile():
    torch.manual_seed(0)
    model, x = Stack(wide_last=True), torch.randn(12, 8)
    reference = copy.deepcopy(model)
    compiled, loss = _train_step(InductorBackend(regional=True), model, x)
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    notes = compiled.trex.graphs[0].lowerings["forward"].notes
    layer_notes = {n.split("(")[1].split(",")[0]: n for n in notes if "(layer " in n}
    assert "reuses" in layer_notes["layer 2"] and "reuses" not in layer_notes["layer 4"], notes


@needs_inductor
@pytest.mark.slow  # a full Inductor compile of the toy stack; the default run has the one above
def test_regional_compilation_is_off_unless_asked_for():
    torch.manual_seed(0)
    model = Stack()
    compiled, _ = _train_step(InductorBackend(), model, torch.randn(12, 8))
    assert not any("regional" in n for n in compiled.trex.graphs[0].lowerings["forward"].notes)


def test_layer_of_reads_the_innermost_layers_index_of_the_module_stack():
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    node.meta["nn_module_stack"] = {
        "a": ("L['self'].model", object),
        "b": ("L['self'].model.layers[3]", object),
        "c": ("L['self'].model.layers[3].mlp", object),
    }
    assert layer_of(node) == 3
    node.meta["nn_module_stack"] = {"a": ("L['self'].model.norm", object)}
    assert layer_of(node) is None
    node.meta = {"fwd_nn_module_stack": {"b": ("model.layers.12.self_attn", object)}}
    assert layer_of(node) == 12


def test_the_regions_run_in_order_and_give_the_graphs_results(monkeypatch):
    """The split itself, without Inductor's C++ compile: each region runs as its fx graph (boxed, emptying its
    argument list as Inductor's code does); loss and gradients equal eager's, and the repeated layers reuse."""
    import torch._inductor.compile_fx as compile_fx

    def as_fx(gm, inputs, **kwargs):
        def run(args):
            outputs = gm(*args)
            args.clear()
            return list(outputs)

        return run

    monkeypatch.setattr(compile_fx, "compile_fx_inner", as_fx)
    torch.manual_seed(0)
    model, x = Stack(), torch.randn(12, 8)
    reference = copy.deepcopy(model)
    compiled, loss = _train_step(InductorBackend(regional=True), model, x)
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    for which in ("forward", "backward"):
        notes = compiled.trex.graphs[0].lowerings[which].notes
        assert sum("(layer" in n and "reuses" in n for n in notes) >= 2, notes
