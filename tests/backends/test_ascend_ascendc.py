"""AscendC kernels for DeepSeek-V4's fused elementwise groups: the numpy model of their tiling equals eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.fx import Interpreter
from torch.fx.experimental.proxy_tensor import make_fx

from trex.backends.ascend.ascendc import (
    BUFFER_NUM,
    VECTOR_CORES,
    TilingModel,
    VectorCoreProfile,
    compile_kernel,
    emit_kernel,
    find_fusion_groups,
    run_eager,
)
from trex.ops.moe import _gated_activation, _gated_activation_backward

V4_LIMIT = 7.0  # DeepSeek-V4's swiglu_limit


def _v4_clamped_swiglu_backward(grad, gate_up):
    return _gated_activation_backward(grad, gate_up, "silu", V4_LIMIT)


def _v4_clamped_swiglu(gate_up):
    return _gated_activation(gate_up, "silu", V4_LIMIT)


def _sigmoid_gated_residual(hidden, gate_logits, update):
    """A generic gated residual, hidden + sigmoid(gate) * update (not taken from V4: the slow test below
    takes its groups from the compiled V4 graph itself)."""
    return hidden + torch.sigmoid(gate_logits) * update


def _cases(dtype):
    g = torch.Generator().manual_seed(0)
    grad, gate_up = torch.randn(37, 24, generator=g) * 4, torch.randn(37, 48, generator=g) * 6
    h, gl, u = (torch.randn(37, 24, generator=g) for _ in range(3))
    return [
        ("clamped_swiglu_backward", _v4_clamped_swiglu_backward, (grad.to(dtype), gate_up.to(dtype))),
        ("clamped_swiglu", _v4_clamped_swiglu, (gate_up.to(dtype),)),
        ("gated_residual", _sigmoid_gated_residual, (h.to(dtype), gl.to(dtype), u.to(dtype))),
    ]


def _group_inputs(gm, args, group):
    seen = {}

    class Record(Interpreter):
        def run_node(self, node):
            seen[node] = super().run_node(node)
            return seen[node]

    Record(gm).run(*args)
    return [seen[n] for n in group.inputs]


# a small UB and 3 cores force several tiles per core and a tail, which the real 192 KiB UB would not on tiny shapes
SMALL = VectorCoreProfile("test-small-ub", vector_cores=3, ub_bytes=4096)


@pytest.mark.parametrize(
    ("dtype", "profile"),
    [
        pytest.param(torch.bfloat16, SMALL, id="bf16-small-ub"),
        pytest.param(torch.float32, SMALL, id="fp32-small-ub", marks=pytest.mark.slow),
        pytest.param(torch.float32, VECTOR_CORES["ascend-910c"], id="fp32-910c", marks=pytest.mark.slow),
        pytest.param(torch.bfloat16, VECTOR_CORES["ascend-910c"], id="bf16-910c", marks=pytest.mark.slow),
    ],
)
def test_numpy_tiling_model_equals_eager_on_three_v4_groups(dtype, profile, tmp_path):
    kernels = 0
    for name, function, args in _cases(dtype):
        gm = make_fx(function)(*args)
        groups = find_fusion_groups(gm)
        assert len(groups) == 1, f"{name}: {len(groups)} groups"
        kernel = emit_kernel(groups[0], profile)
        tiling = kernel.tiling
        assert tiling.ub_bytes_used <= profile.ub_bytes and tiling.tile % 16 == 0
        if profile is SMALL:
            assert tiling.block > tiling.tile and tiling.total % tiling.tile, (
                f"{name}: expected several tiles and a tail"
            )
        inputs = _group_inputs(gm, args, groups[0])
        expected = run_eager(groups[0], inputs)
        got = TilingModel(kernel).run_numpy([i.float().numpy() for i in inputs])
        for a, b in zip(got, expected):
            if dtype == torch.bfloat16:  # the kernel computes in fp32 and rounds the output once
                np.testing.assert_allclose(
                    torch.from_numpy(a).to(dtype).float().numpy(), b.float().numpy(), rtol=2e-2, atol=2e-2
                )
            else:
                np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-5)
        source = kernel.source
        assert f"BUFFER_NUM = {BUFFER_NUM}" in source and "TQue<QuePosition::VECIN, BUFFER_NUM>" in source
        assert f"TILE = {tiling.tile}" in source and "__global__ __aicore__" in source
        result = compile_kernel(kernel, tmp_path)
        assert (tmp_path / f"{kernel.group.name}.cpp").read_text() == source
        if not result.compiled:
            assert "skipped" in result.message or "failed" in result.message
        kernels += 1
    assert kernels == 3


def test_the_clamped_swiglu_backward_kernel_uses_vector_instructions():
    args = _cases(torch.bfloat16)[0][2]
    kernel = emit_kernel(find_fusion_groups(make_fx(_v4_clamped_swiglu_backward)(*args))[0])
    for instruction in ("Mins(", "Maxs(", "Exp(", "CompareScalar(", "Select(", "Cast(", "DataCopyPad("):
        assert instruction in kernel.source
    assert "bfloat16_t" in kernel.source


@pytest.mark.slow
def test_groups_of_the_compiled_v4_graph_get_kernels_whose_tiling_model_equals_eager():
    """Compiles tiny DeepSeek-V4 with backend=["ascend"] (minutes on 2 cores) and emits a kernel for every
    distinct elementwise group left to eager in its forward and backward graphs."""
    import trex
    from trex.models import build_model, tiny_config

    config = tiny_config("deepseek-v4")
    compiled = trex.compile(build_model(config, seed=1), backend=["ascend"])
    input_ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss.backward()
    kinds = {}
    for lowering in compiled.trex.graphs[0].lowerings.values():
        for group in find_fusion_groups(lowering.module):
            kinds.setdefault(tuple(str(n.target) for n in group.nodes), group)
    assert len(kinds) >= 3, f"only {len(kinds)} kinds of elementwise groups in the V4 graph"
    generator = torch.Generator().manual_seed(0)
    for group in kinds.values():
        inputs = []
        for node in group.inputs:
            value = node.meta["val"]
            if value.dtype == torch.bool:
                inputs.append(torch.rand(value.shape, generator=generator) > 0.5)
            else:
                inputs.append((torch.randn(value.shape, generator=generator) * 4).to(value.dtype))
        kernel = emit_kernel(group, SMALL)
        expected = run_eager(group, inputs)
        got = TilingModel(kernel).run_numpy([i.float().numpy() for i in inputs])
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b.float().numpy(), rtol=1e-5, atol=1e-5, err_msg=group.name)
