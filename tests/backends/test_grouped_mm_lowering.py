"""trex's extern grouped GEMMs lowered by Inductor to a direct `torch._grouped_mm` call: the same values as
the extern op's Python body, without the dispatcher's detour through it. (Where trex's Inductor backend has not
placed a grouped GEMM on its own kernel, or was told not to - `cpu_grouped_gemm="aten"`; trex's kernel:
tests/backends/test_cpu_grouped_gemm.py.)"""

from __future__ import annotations

import copy
import re

import pytest
import torch

import trex
import trex.ops.moe_decompositions  # noqa: F401 - the trex.extern_* ops
from trex.backends.inductor import inductor_unavailable_reason
from trex.backends.inductor.backend import InductorBackend
from trex.backends.inductor.grouped_mm_lowering import register_grouped_mm_lowerings

pytestmark = pytest.mark.skipif(inductor_unavailable_reason() is not None, reason=str(inductor_unavailable_reason()))


@pytest.fixture(autouse=True)
def _compiled_here():
    """Inductor's on-disk graph cache keys a graph, not the lowerings that compiled it: a cached module from
    another run would hide what this process's lowering generates."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        yield


def _both_forms(x, w, offsets, a, b):
    return (
        torch.ops.trex.extern_grouped_mm(x, w, offsets),
        torch.ops.trex.extern_grouped_mm_weight_grad(a, b, offsets),
    )


def _operands(dtype, offsets_dtype=torch.int32):
    torch.manual_seed(0)
    rows, k, n, groups = 24, 16, 8, 4
    offsets = torch.tensor([5, 5, 17, 22], dtype=offsets_dtype)  # an empty group and rows past the last offset
    return (
        torch.randn(rows, k, dtype=dtype),
        torch.randn(groups, k, n, dtype=dtype),
        offsets,
        torch.randn(rows, k, dtype=dtype),
        torch.randn(rows, n, dtype=dtype),
    )


def _fallback_calls(code: str) -> int:
    """Calls of the extern ops' Python bodies in generated code (not their names in comments or asserts)."""
    return len(re.findall(r"torch\.ops\.trex\.extern_grouped_mm(?:_weight_grad)?\.default\(", code))


def _compiled_code_and_values(args):
    from torch._inductor.utils import run_and_get_code

    register_grouped_mm_lowerings()
    torch._dynamo.reset()
    values, code = run_and_get_code(torch.compile(_both_forms, backend="inductor", fullgraph=True), *args)
    return "\n".join(code), values


@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
def test_fp32_extern_grouped_mms_become_direct_aten_calls_with_the_bodys_values(offsets_dtype):
    args = _operands(torch.float32, offsets_dtype)
    code, (out, weight_grad) = _compiled_code_and_values(args)
    assert code.count("extern_kernels._grouped_mm(") == 2, code
    assert _fallback_calls(code) == 0, code
    expected_out, expected_weight_grad = _both_forms(*args)  # the ops' Python bodies, op by op
    rows = int(args[2][-1])  # rows past the last offset belong to no group: unwritten by aten's kernel
    assert torch.equal(out[:rows], expected_out[:rows])
    assert torch.equal(weight_grad, expected_weight_grad)


def test_operands_the_body_loops_over_keep_the_fallback():
    args = _operands(torch.float16)  # not a dtype the body hands to aten._grouped_mm
    code, (out, weight_grad) = _compiled_code_and_values(args)
    assert "extern_kernels._grouped_mm(" not in code, code
    assert _fallback_calls(code) == 2, code
    expected_out, expected_weight_grad = _both_forms(*args)
    assert torch.equal(out, expected_out)
    assert torch.equal(weight_grad, expected_weight_grad)


def test_an_fp32_moe_block_through_inductor_calls_aten_directly_and_trains_like_eager():
    from torch._inductor.utils import run_and_get_code

    from tests.backends.test_inductor_backend import TinyBlock

    torch.manual_seed(0)
    model, x = TinyBlock(), torch.randn(12, 16)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=[InductorBackend(cpu_grouped_gemm="aten"), "eager"])

    def step():
        loss = compiled(x)
        loss.backward()
        return loss

    loss, code = run_and_get_code(step)
    code = "\n".join(code)
    # forward: the two expert GEMMs; backward: two data gradients and two weight gradients
    assert code.count("extern_kernels._grouped_mm(") == 6, code
    assert _fallback_calls(code) == 0, code
    expected = reference(x)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
