"""The MoE layers lowered for Ascend convert no routing index and no combine result: the indices are produced and
saved in the dtypes torch_npu's routing ops read (`backends/ascend/routing_indices.py`), and a combine run in fp32
over bf16 rows hands the op's bf16 result straight to the model's cast back (`patterns.MoeCombine`). Results and
gradients stay eager's; with `npu_index_dtypes=False` the conversions are back (what the checks would catch)."""

from __future__ import annotations

import copy

import pytest
import torch

import trex
from trex.backends.ascend import AscendBackend

aten = torch.ops.aten


class _Experts(torch.nn.Module):
    """Routed experts through trex's fused op, as trex.compile routes transformers' experts modules."""

    def __init__(self, dtype=torch.float32, experts=4, hidden=16, inner=8):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.gate_up_proj = torch.nn.Parameter(torch.randn(experts, 2 * inner, hidden, generator=generator).to(dtype))
        self.down_proj = torch.nn.Parameter((torch.randn(experts, hidden, inner, generator=generator) * 0.3).to(dtype))

    def forward(self, x, index, weights):
        import trex.ops.moe  # noqa: F401 - registers torch.ops.trex

        out = torch.ops.trex.moe_experts(x, index, weights, self.gate_up_proj, self.down_proj, "silu", 0.0, False)
        return (out[0].float() * torch.linspace(-1, 1, x.size(-1))).sum()


def _inputs(dtype, weights_dtype):
    """int32 expert ids, as torch_npu's gating ops return them (an int64 router's ids take one conversion to the
    int32 `expert_idx` of npu_moe_init_routing_v2: the router's dtype, not the MoE op set's)."""
    generator = torch.Generator().manual_seed(1)
    index = torch.stack([torch.randperm(4, generator=generator)[:2] for _ in range(10)]).int()
    return (
        torch.randn(10, 16, generator=generator).to(dtype),
        index,
        torch.rand(10, 2, generator=generator).to(weights_dtype),
    )


def _run(backend, dtype=torch.float32, weights_dtype=torch.float32):
    """Compile the toy with `backend`, compare one forward+backward with eager; return the backend's reports."""
    model = _Experts(dtype)
    reference = copy.deepcopy(model)
    x, index, weights = _inputs(dtype, weights_dtype)
    leaves = [x.clone().requires_grad_(True), weights.clone().requires_grad_(True)]
    ref_leaves = [x.clone().requires_grad_(True), weights.clone().requires_grad_(True)]
    out = trex.compile(model, backend=[backend])(leaves[0], index, leaves[1])
    out.backward()
    expected = reference(ref_leaves[0], index, ref_leaves[1])
    expected.backward()
    # bf16: a few roundings of 2**-8 of the largest value (the gradients sum over rows of up to ~60 here)
    scale = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, expected, rtol=scale, atol=scale * float(expected.detach().abs()))
    for got, want in [*zip(leaves, ref_leaves), *zip(model.parameters(), reference.parameters())]:
        atol = scale * float(want.grad.abs().max())
        torch.testing.assert_close(got.grad.float(), want.grad.float(), rtol=scale, atol=atol)
    return [r for r in backend.reports if r.moe_total_s > 0]


def _moe_conversions(reports) -> list[str]:
    """Every `_to_copy` of the MoE layers' lowered graphs: glue a rewrite added, or a graph node left unfused."""
    found = [f"glue {op}" for r in reports for _, op, _, moe in r.glue_nodes if moe and "_to_copy" in op]
    for r in reports:
        found += [f"unfused {name}" for name in r.moe_nodes - r.fused_nodes if "_to_copy" in r.node_ops[name]]
    return found


def test_routing_indices_are_saved_in_the_npu_dtypes_and_never_converted():
    backend = AscendBackend()
    reports = _run(backend)
    assert backend.captured_index_dtypes == 1
    assert _moe_conversions(reports) == []
    # the forward saves init_routing_v2's int32 rows and int64 group ends; the backward GEMMs read them as they are
    assert "npu_moe_init_routing_v2" in {op for r in reports for op in r.emitted}


def test_without_the_npu_index_dtypes_the_lowering_converts_them():
    reports = _run(AscendBackend(npu_index_dtypes=False))
    conversions = _moe_conversions(reports)
    # int32 -> int64 of the rows after the dispatch, int32 -> int64 of the group ends in the backward
    assert len(conversions) >= 2, conversions


def test_a_combine_run_in_fp32_over_bf16_rows_takes_the_ops_bf16_result():
    """DeepSeek-V3's dtype flow: bf16 rows, fp32 routing weights, so the combine runs in fp32 and the model casts the
    result back to bf16 (and the bf16 gradient to fp32 in the backward). npu_moe_token_unpermute writes the rows'
    dtype: its result is what the cast back gives, and its gradient op takes the bf16 gradient as it is."""
    backend = AscendBackend()
    reports = _run(backend, torch.bfloat16, torch.float32)
    assert _moe_conversions(reports) == []
    emitted = {op for r in reports for op in r.emitted}
    assert {"npu_moe_token_unpermute", "npu_moe_token_unpermute_grad"} <= emitted


@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int32), (torch.int32, torch.int32)])
def test_a_graph_that_already_asks_for_other_index_dtypes_is_refused_by_name(dtypes):
    from torch import fx

    from trex.backends.ascend.routing_indices import request_npu_index_dtypes

    graph = fx.Graph()
    args = [graph.placeholder(n) for n in ("x", "index", "weights", "gate_up", "down")]
    graph.call_function(torch.ops.trex.moe_experts.default, (*args, "silu", 0.0, False, *dtypes))
    with pytest.raises(ValueError, match="already asks for index dtypes"):
        request_npu_index_dtypes(fx.GraphModule(torch.nn.Module(), graph))
