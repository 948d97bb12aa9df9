"""Every Triton kernel of trex's library, run by Triton's interpreter on CPU (TRITON_INTERPRET=1),
against its plain-PyTorch reference: forward values and the gradients of every differentiable input."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

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


def _lowest_id_on_ties(values: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest of each row, equal values taken in index order: CUDA's torch.topk selection."""
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[:, :k]


def _group_limited_choice(choice, n_group, topk_group):
    """DeepSeek-V3's group limit with the lowest-id tie rule: -inf outside each row's topk_group best groups."""
    tokens, experts = choice.shape
    group_scores = choice.view(tokens, n_group, -1).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros(tokens, n_group, dtype=torch.bool)
    keep.scatter_(1, _lowest_id_on_ties(group_scores, topk_group), True)
    return choice.masked_fill(~keep.repeat_interleave(experts // n_group, dim=1), float("-inf"))


@pytest.mark.parametrize("score", ["sigmoid", "sqrtsoftplus", "softmax"])
@pytest.mark.parametrize(("n_group", "topk_group"), [(4, 2), (3, 1), (6, 4)], ids=["4-groups", "3-groups", "6-groups"])
def test_group_limited_router_kernel_matches_reference_forward_and_backward(score, n_group, topk_group):
    """DeepSeek-V3's group-limited routing: 12 experts in groups of 4, 3 or 2 (group blocks padded to a power
    of two: the padding's ids repeat the next group's), a bias that changes the winners, k = 3; the logits'
    gradient through the kernel's backward against autograd through the reference."""
    from trex.backends.triton.kernels.router import router_topk, router_topk_reference

    torch.manual_seed(4)
    logits, bias = torch.randn(10, 12) * 2, torch.randn(12) * 0.5
    route = (bias, 3, score, True, 1e-20, 2.5, n_group, topk_group)
    weights, indices = router_topk(logits, *route)
    expected_weights, expected_indices = router_topk_reference(logits, *route)
    torch.testing.assert_close(indices, expected_indices)
    torch.testing.assert_close(weights, expected_weights)
    # the group limit changes the choice for some token (else this test would not test it)
    ungrouped = router_topk_reference(logits, bias, 3, score, True, 1e-20, 2.5)[1]
    assert not torch.equal(indices.sort(-1).values, ungrouped.sort(-1).values)
    _compare(lambda x: router_topk(x, *route)[0], lambda x: router_topk_reference(x, *route)[0], [logits])


@pytest.mark.parametrize(("n_group", "topk_group"), [(1, 1), (4, 2)], ids=["flat", "group-limited"])
def test_router_kernel_breaks_ties_as_cuda_topk_does(n_group, topk_group):
    """Equal choices competing for the last slots (and equal group scores competing for the kept groups): the
    kernel keeps the lower expert (group) id, which is how CUDA's torch.topk selects (the kernel's device).
    The weights are the gathered scores of those experts. Rows: all equal; pairs of equal logits; a bias that
    makes unequal scores tie in the choice."""
    from trex.backends.triton.kernels.router import router_topk

    logits = torch.cat(
        [
            torch.zeros(2, 16),
            torch.tensor([0.5, 1.0, 1.0, 0.5] * 4).repeat(2, 1),
            torch.arange(16.0).flip(0).repeat(2, 1).remainder(3),
        ]
    )
    bias = torch.zeros(16)
    bias[[3, 6]] = torch.sigmoid(torch.tensor(1.0)) - torch.sigmoid(torch.tensor(0.5))  # expert 3, 6 tie 1, 2
    for row_bias in (None, bias):
        weights, indices = router_topk(logits, row_bias, 3, "sigmoid", False, 0.0, 1.0, n_group, topk_group)
        scores = torch.sigmoid(logits)
        choice = scores if row_bias is None else scores + row_bias
        if n_group > 1:
            choice = _group_limited_choice(choice, n_group, topk_group)
        expected = _lowest_id_on_ties(choice, 3)
        torch.testing.assert_close(indices, expected)
        torch.testing.assert_close(weights, scores.gather(1, expected))


def test_router_reference_selects_as_eager_topk_on_ties():
    """Off the kernels' devices (a CPU without TRITON_INTERPRET) the op runs its reference, which selects with
    torch.topk itself: on exact ties it picks what eager picks on that device (the experts' set; its slots
    are sorted), group-limited routing included (transformers' DeepSeek-V3 router run alongside)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from trex.backends.triton.kernels.router import router_topk_reference

    config = DeepseekV3Config(
        hidden_size=8, n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5
    )
    router = DeepseekV3TopkRouter(config)
    torch.nn.init.zeros_(router.weight)  # every logit 0: every score ties
    hidden = torch.randn(5, 8)
    with torch.no_grad():
        _, eager_weights, eager_indices = router(hidden)
        router.weight[:, 0] = torch.tensor([0.5, 1.0, 1.0, 0.5] * 4)  # pairs of equal scores in every group
        _, tied_weights, tied_indices = router(hidden.abs())
    for logits, weights, indices in (
        (torch.zeros(5, 16), eager_weights, eager_indices),
        (hidden.abs() @ router.weight.detach().T, tied_weights, tied_indices),
    ):
        ours_w, ours_i = router_topk_reference(
            logits, router.e_score_correction_bias, 3, "sigmoid", True, 1e-20, 2.5, 4, 2
        )
        assert torch.equal(ours_i.sort(-1).values, indices.sort(-1).values)
        order = indices.argsort(-1)
        torch.testing.assert_close(ours_w, weights.gather(1, order).gather(1, ours_i.argsort(-1).argsort(-1)))


@pytest.mark.parametrize("score", ["sqrtsoftplus", "sigmoid", "softmax"])
@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "raw"])
def test_router_weights_kernel_matches_reference_with_repeated_experts(score, normalize):
    """DeepSeek-V4's hash layers: the weights of experts chosen by a table (which may name one expert twice:
    the slots' gradients then add up), forward and the logits' gradient, against autograd of the reference."""
    from trex.backends.triton.kernels.router import router_weights, router_weights_reference

    torch.manual_seed(5)
    logits = torch.randn(7, 11) * 2  # 11 experts: a masked 16-wide block
    indices = torch.randint(0, 11, (7, 3))
    indices[2] = torch.tensor([4, 4, 9])
    _compare(
        lambda x: router_weights(x, indices, score, normalize, 1e-20, 1.5),
        lambda x: router_weights_reference(x, indices, score, normalize, 1e-20, 1.5),
        [logits],
    )


def test_router_topk_rejects_bad_arguments_with_the_fix():
    from trex.backends.triton.kernels.router import router_topk, router_weights

    with pytest.raises(ValueError, match="score must be one of"):
        router_topk(torch.randn(2, 4), None, 2, "tanh", True, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"top_k must lie in \[1, 4\]"):
        router_topk(torch.randn(2, 4), None, 5, "softmax", True, 0.0, 1.0)
    with pytest.raises(ValueError, match="groups need >= 2 experts"):
        router_topk(torch.randn(2, 4), None, 1, "sigmoid", True, 0.0, 1.0, 4, 1)
    with pytest.raises(ValueError, match="n_group must divide the 6 experts"):
        router_topk(torch.randn(2, 6), None, 1, "sigmoid", True, 0.0, 1.0, 4, 1)
    with pytest.raises(ValueError, match="raise topk_group or lower top_k"):
        router_topk(torch.randn(2, 8), None, 3, "sigmoid", True, 0.0, 1.0, 4, 1)
    with pytest.raises(ValueError, match="indices must be int64"):
        router_weights(torch.randn(2, 8), torch.zeros(2, 2, dtype=torch.int32), "sigmoid", True, 0.0, 1.0)


ROUTER_SM90_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from trex.backends.triton.kernels import router

_, forward, backward = router._kernels(False)
pointers = {"logits_ptr": "*fp32", "bias_ptr": "*fp32", "weights_ptr": "*fp32", "indices_ptr": "*i64"}
scalars = {"E": "i32", "group_size": "i32", "n_group": "i32", "eps": "fp32", "scale": "fp32"}
names = ["TOP_K", "K_BLOCK", "SCORE", "HAS_BIAS", "NORMALIZE", "TOPK_GROUP", "G_BLOCK", "S_BLOCK", "GIVEN"]
signature = {**pointers, **scalars, **dict.fromkeys(names, "constexpr")}
cases = []
for score in (0, 1, 2):  # DeepSeek-V3 (256 experts, 8 groups of 32, 4 kept, top-8), V4 (256, top-6), V4's hash layers
    for values in ((8, 8, score, True, True, 4, 8, 32, False), (6, 8, score, True, True, 0, 1, 256, False)):
        cases.append((forward, signature, dict(zip(names, values))))
    cases.append((forward, signature, dict(zip(names, (6, 8, score, False, True, 0, 1, 256, True)))))
short = {"E": "i32", "eps": "fp32", "scale": "fp32"}
short.update(dict.fromkeys(["TOP_K", "K_BLOCK", "SCORE", "NORMALIZE", "E_BLOCK"], "constexpr"))
pointers = {"grad_ptr": "*fp32", "logits_ptr": "*fp32", "indices_ptr": "*i64", "grad_logits_ptr": "*fp32"}
constants = {"TOP_K": 6, "K_BLOCK": 8, "SCORE": 2, "NORMALIZE": True, "E_BLOCK": 256}
cases.append((backward, {**pointers, **short}, constants))
for kernel, signature, constexprs in cases:
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"], kernel
print("compiled", len(cases))
"""


def test_router_kernels_compile_for_a_gpu_without_one():
    """The router kernels go through Triton's real compiler (TTIR -> PTX -> cubin by the wheel's ptxas) for
    an sm_90 target at DeepSeek-V3/V4 shapes, in a process without the interpreter: the interpreter accepts
    some programs the compiler rejects (a helper that is not jitted, a return inside a branch)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", ROUTER_SM90_COMPILE], capture_output=True, text=True, env=env, timeout=600
    )
    if done.returncode and "ptxas" in done.stderr and "not found" in done.stderr:
        pytest.skip(f"this triton wheel has no ptxas: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiled 10" in done.stdout


@given(
    data=st.data(),
    score=st.sampled_from(["sigmoid", "sqrtsoftplus", "softmax"]),
    normalize=st.booleans(),
    biased=st.booleans(),
)
def test_router_topk_kernel_agrees_with_reference_on_any_routing_shape(data, score, normalize, biased):
    """Any experts count, grouping (group sizes that are not powers of two included), topk_group and k the
    op accepts: the kernel chooses the reference's experts (random logits: no ties) with its weights."""
    from trex.backends.triton.kernels.router import router_topk, router_topk_reference

    n_group = data.draw(st.integers(1, 5), label="n_group")
    group_size = data.draw(st.integers(2, 7), label="group_size")
    topk_group = data.draw(st.integers(1, n_group), label="topk_group")
    kept = group_size * (topk_group if n_group > 1 else 1)
    top_k = data.draw(st.integers(1, min(kept, 8)), label="top_k")
    tokens = data.draw(st.integers(1, 5), label="tokens")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    generator = torch.Generator().manual_seed(seed)
    experts = n_group * group_size
    logits = torch.randn(tokens, experts, generator=generator) * 2
    bias = torch.randn(experts, generator=generator) * 0.3 if biased else None
    route = (bias, top_k, score, normalize, 1e-20, 1.5, n_group, topk_group)
    weights, indices = router_topk(logits, *route)
    expected_weights, expected_indices = router_topk_reference(logits, *route)
    torch.testing.assert_close(indices, expected_indices)
    torch.testing.assert_close(weights, expected_weights)
