"""Every Triton kernel of trex's library, run by Triton's interpreter on CPU (TRITON_INTERPRET=1),
against its plain-PyTorch reference: forward values and the gradients of every differentiable input."""

from __future__ import annotations

import pytest
import torch

from trex.backends.triton.availability import kernels_run_on, triton_import_error

pytestmark = pytest.mark.skipif(triton_import_error() is not None, reason=str(triton_import_error()))


@pytest.fixture(autouse=True)
def _interpreter():
    """tests/conftest.py turns the interpreter on before triton is imported; the kernels must run."""
    assert kernels_run_on(torch.empty(1)), "TRITON_INTERPRET=1 must be set before triton is first imported"


def _compare(op, reference, inputs, *, atol=1e-5, rtol=1e-5, trained=None):
    """op and reference agree on the output and on the gradient of every trained input (default: all)."""
    trained = range(len(inputs)) if trained is None else trained
    ours = [t.detach().clone().requires_grad_(i in trained) for i, t in enumerate(inputs)]
    theirs = [t.detach().clone().requires_grad_(i in trained) for i, t in enumerate(inputs)]
    out, expected = op(*ours), reference(*theirs)
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    grad = torch.randn_like(expected)
    (out * grad).sum().backward()
    (expected * grad).sum().backward()
    for a, b in zip(ours, theirs):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, atol=atol, rtol=rtol)


def test_rms_norm_kernel_matches_reference_forward_and_backward():
    from trex.backends.triton.kernels.rms_norm import rms_norm, rms_norm_reference

    x, w = torch.randn(2, 5, 48), torch.randn(48)  # 48 columns: a masked block of 64
    _compare(lambda a, b: rms_norm(a, b, 1e-6), lambda a, b: rms_norm_reference(a, b, 1e-6), [x, w])


def test_swiglu_kernel_matches_reference_forward_and_backward():
    from trex.backends.triton.kernels.swiglu import swiglu, swiglu_reference

    gate, up = torch.randn(3, 700) * 3, torch.randn(3, 700)  # 2100 elements: three blocks, the last partial
    _compare(swiglu, swiglu_reference, [gate, up])


def test_rope_kernel_matches_reference_forward_and_backward():
    from trex.backends.triton.kernels.rope import rope, rope_reference

    x = torch.randn(2, 3, 5, 12)
    angles = torch.randn(2, 5, 6)
    cos, sin = (
        torch.cat([angles.cos(), angles.cos()], -1),
        torch.cat([angles.sin(), (angles * 0.7).sin()], -1),
    )  # unequal halves too
    _compare(rope, rope_reference, [x, cos, sin], trained=(0,))  # cos/sin: position tables, not trained


def test_grouped_gemm_kernel_matches_reference_with_empty_and_ragged_experts():
    from trex.backends.triton.kernels.grouped_gemm import grouped_mm, grouped_mm_reference

    offsets = torch.tensor([5, 5, 40, 47], dtype=torch.int32)  # expert 1 empty, expert 2 spans two row tiles
    x, w = torch.randn(47, 20), torch.randn(4, 20, 36)  # K and N not multiples of the 32-wide tiles
    _compare(
        lambda a, b: grouped_mm(a, b, offsets),
        lambda a, b: grouped_mm_reference(a, b, offsets),
        [x, w],
        atol=1e-4,
        rtol=1e-4,
    )


def test_grouped_gemm_matches_trex_grouped_mm_op():
    """The kernel computes what the trex MoE op set's grouped_mm means (torch._grouped_mm on CPU)."""
    import trex.ops  # noqa: F401
    from trex.backends.triton.kernels.grouped_gemm import grouped_mm

    offsets = torch.tensor([3, 10, 10, 16], dtype=torch.int32)
    x, w = torch.randn(16, 8), torch.randn(4, 8, 24)
    torch.testing.assert_close(
        grouped_mm(x, w, offsets), torch.ops.trex.grouped_mm(x, w, offsets), atol=1e-4, rtol=1e-4
    )


def test_linear_cross_entropy_kernel_matches_reference_with_ignored_rows_and_chunks():
    from trex.backends.triton.kernels import linear_cross_entropy as lce

    h, w = torch.randn(11, 16), torch.randn(1500, 16) * 0.3  # vocab 1500: two vocab blocks
    labels = torch.randint(0, 1500, (11,))
    labels[[2, 7]] = -100
    _compare(
        lambda a, b: lce.linear_cross_entropy(a, b, labels, -100, 4),
        lambda a, b: lce.linear_cross_entropy_reference(a, b, labels, -100),
        [h, w],
        atol=1e-5,
        rtol=1e-4,
    )


def test_kernels_fall_back_to_reference_without_the_interpreter(monkeypatch):
    """Off a GPU and without TRITON_INTERPRET the ops still compute (their reference), same values."""
    from trex.backends.triton.kernels.swiglu import swiglu

    gate, up = torch.randn(4, 10), torch.randn(4, 10)
    interpreted = swiglu(gate, up)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not kernels_run_on(gate)
    torch.testing.assert_close(swiglu(gate, up), interpreted)


def test_moe_permute_kernel_matches_reference_and_trex_dispatch():
    """Counting-sort permute across several slot blocks, with dropped slots, against the reference (all four
    outputs and the gradient of hidden), and against `trex.moe_dispatch` where every id is an expert."""
    import trex.ops  # noqa: F401
    from trex.backends.triton.kernels.moe_permute import moe_permute, moe_permute_reference

    torch.manual_seed(0)
    tokens, top_k, experts = 37, 3, 5  # 111 slots: two 64-slot blocks, the second partial
    hidden = torch.randn(tokens, 150)  # 150 columns: two 128-wide blocks
    index = torch.randint(0, experts, (tokens, top_k))
    index[3, 1], index[5, 0] = experts + 2, -1  # dropped slots sort after every expert
    ours, theirs = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    out, expected = moe_permute(ours, index, experts), moe_permute_reference(theirs, index, experts)
    for a, b in zip(out, expected):
        torch.testing.assert_close(a, b)
    grad = torch.randn_like(expected[0])
    (out[0] * grad).sum().backward()
    (expected[0] * grad).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)

    index = torch.randint(0, experts, (tokens, top_k))
    permuted, perm, inverse, offsets = moe_permute(hidden, index, experts)
    sorted_hidden, dispatch_perm, dispatch_offsets = torch.ops.trex.moe_dispatch(hidden, index, experts)
    torch.testing.assert_close(permuted, sorted_hidden)
    torch.testing.assert_close(perm, dispatch_perm)
    torch.testing.assert_close(offsets, dispatch_offsets)
    torch.testing.assert_close(inverse[perm], torch.arange(tokens * top_k))


def test_moe_unpermute_kernel_matches_reference_forward_and_backward():
    from trex.backends.triton.kernels.moe_permute import moe_permute, moe_unpermute, moe_unpermute_reference

    torch.manual_seed(1)
    tokens, top_k, experts = 21, 4, 6
    _, _, inverse, _ = moe_permute(torch.randn(tokens, 8), torch.randint(0, experts, (tokens, top_k)), experts)
    expert_out, weights = torch.randn(tokens * top_k, 130), torch.rand(tokens, top_k)
    _compare(
        lambda out, w: moe_unpermute(out, inverse, w),
        lambda out, w: moe_unpermute_reference(out, inverse, w),
        [expert_out, weights],
    )


@pytest.mark.parametrize("score", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "raw"])
@pytest.mark.parametrize("biased", [True, False], ids=["bias", "no-bias"])
def test_router_topk_kernel_matches_reference_forward_and_backward(score, normalize, biased):
    """Scores, aux-free-bias selection (the bias moves the choice, not the weights), normalisation and
    scaling; the logits' gradient. 11 experts (a masked 16-wide block), k = 3."""
    from trex.backends.triton.kernels.router import router_topk, router_topk_reference

    torch.manual_seed(2)
    logits = torch.randn(9, 11) * 2
    bias = torch.randn(11) * 0.5 if biased else None
    weights, indices = router_topk(logits, bias, 3, score, normalize, 1e-20, 2.5)
    expected_weights, expected_indices = router_topk_reference(logits, bias, 3, score, normalize, 1e-20, 2.5)
    torch.testing.assert_close(indices, expected_indices)
    if biased:  # the bias changes which experts win for some token
        assert not torch.equal(indices, router_topk_reference(logits, None, 3, score, normalize, 1e-20, 2.5)[1])
    _compare(
        lambda x: router_topk(x, bias, 3, score, normalize, 1e-20, 2.5)[0],
        lambda x: router_topk_reference(x, bias, 3, score, normalize, 1e-20, 2.5)[0],
        [logits],
    )
    torch.testing.assert_close(weights, expected_weights)


@pytest.mark.parametrize("score", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "raw"])
def test_router_topk_closed_form_backward_equals_autograd_of_the_reference(score, normalize):
    """The backward op's body off the kernels' devices (no autograd there: it runs below the autograd key)."""
    from trex.backends.triton.kernels.router import router_topk_backward_reference, router_topk_reference

    torch.manual_seed(3)
    logits = (torch.randn(7, 10) * 2).requires_grad_()
    weights, indices = router_topk_reference(logits, None, 3, score, normalize, 1e-6, 1.5)
    grad = torch.randn_like(weights)
    (expected,) = torch.autograd.grad(weights, logits, grad)
    got = router_topk_backward_reference(grad, logits.detach(), indices, score, normalize, 1e-6, 1.5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_router_topk_rejects_bad_arguments_with_the_fix():
    from trex.backends.triton.kernels.router import router_topk

    with pytest.raises(ValueError, match="score must be one of"):
        router_topk(torch.randn(2, 4), None, 2, "tanh", True, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"top_k must lie in \[1, 4\]"):
        router_topk(torch.randn(2, 4), None, 5, "softmax", True, 0.0, 1.0)
