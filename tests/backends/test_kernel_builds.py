"""Inductor's C++ kernel builds finish at a compiled graph's first call, and the backward is lowered right
after the forward, while the forward's kernels build (backends/inductor/kernel_builds.py): the graphs
compute what eager computes, the wait is done before the generated code runs, and a failed build is an
error that names the region."""

from __future__ import annotations

import copy

import pytest
import torch

import trex
from trex.backends.inductor import InductorBackend, inductor_unavailable_reason
from trex.backends.inductor.kernel_builds import KernelBuilds, can_defer
from trex.errors import BackendError

needs_inductor = pytest.mark.skipif(
    inductor_unavailable_reason() is not None, reason=str(inductor_unavailable_reason())
)


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 8)

    def forward(self, x):
        return (self.b(torch.nn.functional.gelu(self.a(x))).sin() ** 2).sum()


def _traced(x):
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(t):
        return ((t.exp() * 2 + 1).cos().sum(0),)

    gm = make_fx(f)(x)
    examples = [p.meta["val"] for p in gm.graph.find_nodes(op="placeholder")]
    return f, gm, examples


@needs_inductor
def test_a_region_returns_before_its_kernels_are_loaded_and_waits_for_them_at_its_first_call():
    x = torch.randn(5, 7)
    f, gm, examples = _traced(x)
    backend = InductorBackend(background_builds=True)
    compiled = backend.lower(gm, examples)
    builds = compiled.trex_kernel_builds
    assert builds.pending  # Inductor's `async_compile.wait(globals())` was recorded, not run
    (_, _, scope) = builds.waits[0]
    assert any(type(value).__name__ == "LambdaFuture" for value in scope.values())  # kernels still futures
    before = sum(backend.compile_seconds.values())
    torch.testing.assert_close(compiled(x)[0], f(x)[0])
    assert not builds.pending
    assert not any(type(value).__name__ == "LambdaFuture" for value in scope.values())
    assert sum(backend.compile_seconds.values()) >= before  # the wait counts as the region's compile time
    torch.testing.assert_close(compiled(x)[0], f(x)[0])  # later calls: nothing left to wait for


@needs_inductor
def test_a_failed_kernel_build_is_an_error_naming_the_region_at_the_first_call():
    x = torch.randn(5, 7)
    _, gm, examples = _traced(x)
    compiled = InductorBackend(background_builds=True).lower(gm, examples)

    def broken(async_compile, scope):
        raise RuntimeError("C++ compile failed: no space left on device")

    builds = compiled.trex_kernel_builds
    builds.waits = [(broken, None, {})]
    with pytest.raises(BackendError, match=r"C\+\+ kernels of region .*no space left.*backend=\['eager'\]"):
        compiled(x)


def test_waits_are_not_deferred_where_generated_code_runs_while_compiling():
    import torch._inductor.config as inductor_config

    cpu = [torch.empty(2)]
    assert can_defer(cpu)
    assert not can_defer([torch.empty(2, device="meta")])
    with inductor_config.patch(max_autotune=True):
        assert not can_defer(cpu)
    with inductor_config.patch(cpp_wrapper=True):
        assert not can_defer(cpu)


def test_deferring_records_the_wait_and_restores_inductors_wait():
    from torch._inductor.async_compile import AsyncCompile

    original = AsyncCompile.wait
    builds = KernelBuilds()
    scope = {"kernel": "future"}
    with builds.deferring():
        AsyncCompile().wait(scope)
    assert AsyncCompile.wait is original
    assert builds.pending and builds.waits[0][0] is original and builds.waits[0][2] is scope
    seen = []
    builds.waits = [(lambda compile_, s: seen.append(s), None, scope)]
    builds.on_finish.append(lambda seconds: seen.append(seconds >= 0))
    builds.finish()
    builds.finish()  # once
    assert seen == [scope, True, True] and not builds.pending


@needs_inductor
def test_the_backward_is_lowered_with_the_forward_and_training_matches_eager():
    torch.manual_seed(0)
    model, x = TwoLayers(), torch.randn(4, 8)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=[InductorBackend(background_builds=True), "eager"])
    loss = compiled(x)
    graph = compiled.trex.graphs[0]
    assert set(graph.lowerings) == {"forward", "backward"}  # before any backward call
    backward = graph.lowerings["backward"].module.trex_kernel_builds
    assert backward.pending  # its kernels: waited for at its first call
    loss.backward()
    assert not backward.pending
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


@needs_inductor
def test_without_background_builds_the_backward_stays_lazy_and_the_compile_waits_for_its_kernels():
    model, x = TwoLayers(), torch.randn(4, 8)
    for backends in (["eager"], ["inductor", "eager"]):  # the default Inductor backend waits inside its compile
        torch._dynamo.reset()
        compiled = trex.compile(copy.deepcopy(model), backend=backends)
        compiled(x)
        graph = compiled.trex.graphs[0]
        assert set(graph.lowerings) == {"forward"}
        builds = getattr(graph.lowerings["forward"].module, "trex_kernel_builds", None)
        assert builds is None or not builds.pending
