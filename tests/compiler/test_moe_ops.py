"""The trex MoE op set computes routed experts exactly, forward and backward, in fp32 and bf16."""

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

from trex.ops import moe as moe_ops

ops = torch.ops.trex


def _routing(tokens, experts, top_k, seed=0):
    generator = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(experts, generator=generator)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=generator)
    return index, weights / weights.sum(-1, keepdim=True)


def _loop_reference(hidden, index, weights, gate_up_proj, down_proj, limit=0.0):
    """Token by token, expert by expert, in float64: the definition of routed experts."""
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for slot in range(index.shape[1]):
            expert = index[t, slot]
            gate, up = (hidden[t].double() @ gate_up_proj[expert].double().T).chunk(2)
            if limit:
                gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            out[t] += weights[t, slot].double() * ((F.silu(gate) * up) @ down_proj[expert].double().T)
    return out


def _case(dtype, tokens=12, hidden=16, inter=8, experts=4, top_k=2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    index, weights = _routing(tokens, experts, top_k, seed)
    tensors = [
        torch.randn(tokens, hidden, generator=generator),
        weights,
        torch.randn(experts, 2 * inter, hidden, generator=generator) * hidden**-0.5,
        torch.randn(experts, hidden, inter, generator=generator) * inter**-0.5,
    ]
    hidden_states, weights, gate_up, down = (t.to(dtype).requires_grad_(True) for t in tensors)
    return hidden_states, index, weights, gate_up, down


@pytest.mark.parametrize("limit", [0.0, 0.7])
def test_fused_op_matches_the_per_token_loop_forward_and_backward_fp32(limit):
    hidden, index, weights, gate_up, down = _case(torch.float32)
    out = ops.moe_experts(hidden, index, weights, gate_up, down, "silu", limit, False)[0]
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (hidden, weights, gate_up, down), grad)

    leaves = [t.detach().double().requires_grad_(True) for t in (hidden, weights, gate_up, down)]
    expected = _loop_reference(leaves[0], index, leaves[1], leaves[2], leaves[3], limit)
    expected_grads = torch.autograd.grad(expected, leaves, grad.double())

    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_fused_op_in_bf16_stays_within_bf16_error_of_the_fp64_loop():
    hidden, index, weights, gate_up, down = _case(torch.bfloat16)
    out = ops.moe_experts(hidden, index, weights, gate_up, down, "silu", 0.0, False)[0]
    assert out.dtype == torch.bfloat16
    expected = _loop_reference(hidden.detach(), index, weights.detach(), gate_up.detach(), down.detach())
    torch.testing.assert_close(out.double(), expected, rtol=3e-2, atol=3e-2)


def test_primitives_compose_to_the_fused_op_with_identical_gradients():
    hidden, index, weights, gate_up, down = _case(torch.float32)
    fused = ops.moe_experts(hidden, index, weights, gate_up, down, "silu", 0.0, False)[0]
    sorted_hidden, perm, offsets = ops.moe_dispatch(hidden, index, 4)
    activated = moe_ops._gated_activation(
        ops.grouped_mm(sorted_hidden, gate_up.transpose(-2, -1), offsets), "silu", 0.0
    )
    composed = ops.moe_combine(ops.grouped_mm(activated, down.transpose(-2, -1), offsets), perm, weights)
    grad = torch.randn_like(fused)
    fused_grads = torch.autograd.grad(fused, (hidden, weights, gate_up, down), grad)
    composed_grads = torch.autograd.grad(composed, (hidden, weights, gate_up, down), grad)
    torch.testing.assert_close(composed, fused)
    for a, b in zip(composed_grads, fused_grads):
        torch.testing.assert_close(a, b)


def test_transposed_expert_weights_give_the_same_result():
    hidden, index, weights, gate_up, down = _case(torch.float32)
    plain = ops.moe_experts(hidden, index, weights, gate_up, down, "silu", 0.0, False)[0]
    transposed = ops.moe_experts(
        hidden,
        index,
        weights,
        gate_up.transpose(-2, -1).contiguous(),
        down.transpose(-2, -1).contiguous(),
        "silu",
        0.0,
        True,
    )[0]
    torch.testing.assert_close(transposed, plain)


def test_dispatch_groups_rows_by_expert_with_cumulative_offsets():
    index = torch.tensor([[2, 0], [2, 1], [0, 2]])
    hidden = torch.arange(3.0).unsqueeze(-1).expand(3, 2).contiguous()
    sorted_hidden, perm, offsets = ops.moe_dispatch(hidden, index, 4)
    assert offsets.tolist() == [2, 3, 6, 6]  # expert 0: 2 rows, 1: 1 row, 2: 3 rows, 3: none
    assert index.reshape(-1)[perm].tolist() == [0, 0, 1, 2, 2, 2]
    assert sorted_hidden[:, 0].tolist() == [0.0, 2.0, 1.0, 0.0, 1.0, 2.0]


def test_stride_zero_gradient_is_accepted():
    """_grouped_mm's backward rejects stride-0 gradients; `out.sum().backward()` produces them."""
    hidden, index, weights, gate_up, down = _case(torch.float32)
    ops.moe_experts(hidden, index, weights, gate_up, down, "silu", 0.0, False)[0].sum().backward()
    assert torch.isfinite(gate_up.grad).all() and gate_up.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ops_pass_torch_library_opcheck(dtype):
    hidden, index, weights, gate_up, down = (t.detach() if isinstance(t, torch.Tensor) else t for t in _case(dtype))
    opcheck(ops.moe_experts.default, (hidden, index, weights, gate_up, down, "silu", 0.0, False))
    sorted_hidden, perm, offsets = ops.moe_dispatch(hidden, index, 4)
    static = ("test_schema", "test_faketensor", "test_aot_dispatch_static")
    opcheck(ops.moe_dispatch.default, (hidden, index, 4), test_utils=static)
    opcheck(ops.grouped_mm.default, (sorted_hidden, gate_up.transpose(-2, -1).contiguous(), offsets), test_utils=static)
    opcheck(ops.grouped_mm_weight_grad.default, (sorted_hidden, sorted_hidden, offsets), test_utils=static)
    opcheck(ops.moe_combine.default, (sorted_hidden, perm, weights), test_utils=static)


def test_fake_implementation_gives_static_shapes_for_fp32_capture():
    """aten._grouped_mm's meta kernel takes only bf16; the trex op's fake kernel takes any dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        hidden = torch.empty(10, 16)
        index = torch.zeros(10, 3, dtype=torch.long)
        out, perm, offsets, sorted_hidden, gate_up_out, expert_out = ops.moe_experts(
            hidden, index, torch.empty(10, 3), torch.empty(5, 24, 16), torch.empty(5, 16, 12), "silu", 0.0, False
        )
    assert (tuple(out.shape), tuple(perm.shape), tuple(offsets.shape)) == ((10, 16), (30,), (5,))
    assert (tuple(sorted_hidden.shape), tuple(gate_up_out.shape), tuple(expert_out.shape)) == (
        (30, 16),
        (30, 24),
        (30, 16),
    )


@pytest.mark.parametrize("limit", [0.0, 0.7])
def test_other_index_dtypes_give_the_same_values_and_gradients(limit):
    """A backend may ask for int32 perm and int64 offsets (the Ascend backend: the dtypes torch_npu's routing ops
    read); the op then produces and saves them so, and every output and gradient is the one of the defaults."""
    results = []
    for dtypes in ((), (torch.int32, torch.int64)):
        hidden, index, weights, gate_up, down = _case(torch.float32)
        out, perm, offsets, *_ = ops.moe_experts(hidden, index, weights, gate_up, down, "silu", limit, False, *dtypes)
        grads = torch.autograd.grad(out, (hidden, weights, gate_up, down), torch.ones_like(out))
        results.append((out, perm, offsets, grads))
    (out, perm, offsets, grads), (out32, perm32, offsets64, grads32) = results
    assert (perm.dtype, offsets.dtype, perm32.dtype, offsets64.dtype) == (
        torch.int64,
        torch.int32,
        torch.int32,
        torch.int64,
    )
    assert torch.equal(perm, perm32.long()) and torch.equal(offsets.long(), offsets64)
    torch.testing.assert_close(out32, out, rtol=0, atol=0)
    for got, want in zip(grads32, grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_index_dtypes_other_than_int32_or_int64_are_refused_by_name():
    hidden, index, *_ = _case(torch.float32)
    with pytest.raises(ValueError, match="perm_dtype must be torch.int32 or torch.int64"):
        ops.moe_dispatch(hidden, index, 4, torch.float32)
    with pytest.raises(ValueError, match="offsets_dtype must be torch.int32 or torch.int64"):
        ops.moe_dispatch(hidden, index, 4, torch.int64, torch.int16)


def test_passes_written_for_the_default_index_dtypes_see_a_graph_that_asks_for_others():
    """passes.decompose_moe (written for the default index dtypes) leaves a graph whose dispatch asks for others."""
    from torch import fx

    cases = [((), {}, False), ((torch.int64, torch.int32), {}, False), ((torch.int32, torch.int64), {}, True)]
    cases.append(((), {"offsets_dtype": torch.int64}, True))
    for extra, keywords, expected in cases:
        graph = fx.Graph()
        hidden, index = graph.placeholder("hidden"), graph.placeholder("index")
        graph.call_function(ops.moe_dispatch.default, (hidden, index, 4, *extra), keywords)
        assert moe_ops.asks_other_index_dtypes(graph) is expected, (extra, keywords)
