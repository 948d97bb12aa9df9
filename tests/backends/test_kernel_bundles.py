"""Kernel bundles (backends/inductor/kernel_bundles.py): a graph's C++ kernels built as a few translation units.

The real mechanism runs: Inductor generates the kernels, its own code cache builds the bundles with g++ and
loads them; the values are compared with the same graphs built one library per kernel (Inductor's own way).
"""

from __future__ import annotations

import pytest
import torch

import trex
from trex.backends.inductor import InductorBackend, inductor_unavailable_reason, kernel_bundles
from trex.backends.inductor.kernel_bundles import BundledKernel, KernelBundler, bundleable, split_into_bundles

pytestmark = pytest.mark.skipif(inductor_unavailable_reason() is not None, reason="Inductor unavailable")

_SCALE = """#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       float* out_ptr0,
                       const int64_t ks0,
                       const float scale)
{
    for (int64_t i = 0; i < ks0; ++i)
    {
        out_ptr0[i] = in_ptr0[i] * scale;
    }
}
"""

_ADD = """#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       const float* in_ptr1,
                       float* out_ptr0)
{
    #pragma GCC ivdep
    for (int64_t i = 0; i < 8; ++i)
    {
        out_ptr0[i] = in_ptr0[i] + in_ptr1[i];
    }
}
"""


@pytest.fixture
def two_compile_threads():
    import torch._inductor.config as inductor_config

    with inductor_config.patch(compile_threads=2, force_disable_caches=True):
        yield


def test_split_keeps_every_kernel_once_and_balances_source_length():
    kernels = [BundledKernel(("float*",), "x" * n, index=i) for i, n in enumerate([90, 10, 50, 40, 30, 20])]
    groups = split_into_bundles(kernels, 2)
    assert sorted(k.index for g in groups for k in g) == list(range(6))
    sizes = [sum(len(k.source) for k in g) for g in groups]
    assert max(sizes) - min(sizes) <= 10  # 120 / 120 by longest-first to the lightest
    assert len(split_into_bundles(kernels[:1], 4)) == 1  # never more bundles than kernels


def test_only_sources_with_one_c_entry_and_no_other_directives_are_bundled():
    assert bundleable(["const float*", "float*", "const int64_t", "const float"], _SCALE)  # Inductor's own types
    assert bundleable(["const float*", "float*", "int64_t", "float"], _SCALE)
    assert bundleable(["const float*", "const float*", "float*"], _ADD)
    assert not bundleable(["float*"], "#define N 8\n" + _ADD)  # a macro at file scope could collide
    assert not bundleable(["float*"], _ADD + 'extern "C" void helper() {}\n')  # two C entries
    assert not bundleable(["c10::complex<float>"], _ADD)  # an argument type the entry points do not parse


def test_a_bundle_builds_loads_and_calls_each_kernel_with_its_arguments(two_compile_threads):
    from torch._inductor.async_compile import AsyncCompile

    bundler = KernelBundler()
    with bundler.collecting():
        async_compile = AsyncCompile()
        scope = {
            "scale": async_compile.cpp_pybinding(["const float*", "float*", "const int64_t", "float"], _SCALE),
            "add": async_compile.cpp_pybinding(["const float*", "const float*", "float*"], _ADD),
            "add_again": async_compile.cpp_pybinding(["const float*", "const float*", "float*"], _ADD),
        }
        async_compile.wait(scope)
    assert len(bundler.kernels) == 2 and bundler.failures == []  # the repeated source is one kernel
    assert sum(len(b.kernels) for b in bundler.bundles) == 2 and len(bundler.bundles) == 2
    x, y, out = torch.arange(8.0), torch.full((8,), 0.5), torch.empty(8)
    scope["scale"](x, out, 5, 3.0)
    assert torch.equal(out[:5], x[:5] * 3.0)
    scope["add"](x, y, out)
    assert torch.equal(out, x + y)
    assert scope["add_again"] is scope["add"]
    with pytest.raises(RuntimeError, match="takes a tuple of 3 arguments"):
        scope["add"](x, y)
    assert "2 kernels built in 2 C++ builds" in bundler.summary()


def test_a_bundle_that_fails_to_build_falls_back_to_one_library_per_kernel(two_compile_threads, monkeypatch):
    from torch._inductor.async_compile import AsyncCompile

    monkeypatch.setattr(kernel_bundles, "bundle_source", lambda kernels: "this is not C++;\n")
    bundler = KernelBundler()
    with bundler.collecting(), pytest.warns(RuntimeWarning, match="kernel_bundles=False"):
        async_compile = AsyncCompile()
        scope = {"add": async_compile.cpp_pybinding(["const float*", "const float*", "float*"], _ADD)}
        async_compile.wait(scope)
    x, y, out = torch.arange(8.0), torch.ones(8), torch.empty(8)
    scope["add"](x, y, out)
    assert torch.equal(out, x + 1)
    assert len(bundler.failures) == 1 and "built kernel by kernel" in bundler.summary()


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.up(x)) * torch.sigmoid(x.sum(-1, keepdim=True))
        return torch.nn.functional.rms_norm(self.down(h) + x, (16,)).softmax(-1)


def _step(bundles: bool, builds: list[str]):
    torch.manual_seed(0)
    model = _Block()
    x = torch.randn(8, 16, requires_grad=True)
    compiled = trex.compile(model, backend=[InductorBackend(kernel_bundles=bundles), "eager"])
    out = compiled(x)
    out.pow(2).sum().backward()
    notes = [note for g in compiled.trex.graphs for lw in g.lowerings.values() for note in lw.notes]
    return out.detach(), [p.grad for p in model.parameters()] + [x.grad], notes


def test_bundled_kernels_compute_what_inductor_s_own_builds_compute(two_compile_threads, monkeypatch):
    from torch._inductor import cpp_builder

    builds: list[str] = []
    original = cpp_builder.CppBuilder.build

    def counted(self):
        builds.append(self.get_command_line())
        return original(self)

    monkeypatch.setattr(cpp_builder.CppBuilder, "build", counted)
    alone_out, alone_grads, _ = _step(False, builds)
    alone_builds = len([b for b in builds if ".main.cpp" in b])
    builds.clear()
    out, grads, notes = _step(True, builds)
    bundled_builds = len([b for b in builds if ".main.cpp" in b])
    assert torch.equal(out, alone_out)  # the same generated code, compiler and flags: bit-equal
    assert all(torch.equal(a, b) for a, b in zip(grads, alone_grads))
    assert any("kernel bundles:" in n for n in notes) and not any("failed" in n for n in notes)
    assert bundled_builds <= 4 < alone_builds  # forward and backward: at most one build per compile thread each


@pytest.mark.slow
def test_tiny_qwen3_moe_trains_bit_equal_with_and_without_kernel_bundles(two_compile_threads):
    """A real MoE model's forward and backward (tens of kernels per graph, the decomposed MoE's gathers included):
    loss and every gradient bit-equal between bundled builds and Inductor's one build per kernel."""
    from trex.models import build_model, tiny_config

    config = tiny_config("qwen3-moe")
    input_ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    results = {}
    for bundles in (True, False):
        model = build_model(config, seed=0)
        compiled = trex.compile(model, backend=[InductorBackend(kernel_bundles=bundles), "eager"])
        loss = compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
        results[bundles] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
        notes = [note for g in compiled.trex.graphs for lw in g.lowerings.values() for note in lw.notes]
        assert any("kernel bundles:" in n for n in notes) == bundles
    assert torch.equal(results[True][0], results[False][0])
    for name, grad in results[True][1].items():
        assert torch.equal(grad, results[False][1][name]), name
