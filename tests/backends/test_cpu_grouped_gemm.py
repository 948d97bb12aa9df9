"""trex's CPU grouped GEMM kernel: every layout a training step gives it computes each group's product (against a
per-group `mm` loop), and the Inductor lowering places fp32 grouped GEMMs on it by the policy the user picks."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import trex
from trex.backends.inductor import cpu_grouped_gemm, inductor_unavailable_reason
from trex.backends.inductor.backend import InductorBackend

pytestmark = pytest.mark.skipif(inductor_unavailable_reason() is not None, reason=str(inductor_unavailable_reason()))


@pytest.fixture(autouse=True)
def _compiled_here():
    """Inductor's on-disk graph cache keys a graph, not the lowerings that compiled it."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        yield


def _rows_reference(a, b, offsets):
    out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64)
    start = 0
    for group, end in enumerate(offsets.tolist()):
        out[start:end] = a[start:end].double() @ b[group].double()
        start = end
    return out


def _weight_grad_reference(a, b, offsets):
    out = torch.zeros(offsets.numel(), a.shape[1], b.shape[1], dtype=torch.float64)
    start = 0
    for group, end in enumerate(offsets.tolist()):
        out[group] = a[start:end].double().t() @ b[start:end].double()
        start = end
    return out


def _offsets(rows, groups, cuts, covered):
    """Cumulative row ends: `groups` groups (empty ones included) over the first `covered` rows."""
    ends = sorted(min(c, covered) for c in cuts[: groups - 1]) + [covered]
    return torch.tensor(ends, dtype=torch.int32)


@given(
    rows=st.integers(0, 70),
    depth=st.integers(1, 80),
    cols=st.integers(1, 150),
    groups=st.integers(1, 6),
    cuts=st.lists(st.integers(0, 70), min_size=5, max_size=5),
    uncovered=st.integers(0, 3),
    transposed=st.booleans(),
)
def test_every_layout_computes_each_groups_product(rows, depth, cols, groups, cuts, uncovered, transposed):
    """Forward (weight rows contiguous), input gradient (weight transposed: packed panel by panel) and weight
    gradient, on shapes off every vector and tile boundary, with empty groups and rows past the last offset (zero
    in the output, as in no group)."""
    torch.manual_seed(0)
    covered = max(rows - uncovered, 0)
    offsets = _offsets(rows, groups, cuts, covered)
    a = torch.randn(rows, depth)
    b = torch.randn(groups, depth, cols) if not transposed else torch.randn(groups, cols, depth).transpose(1, 2)
    out = torch.full((rows, cols), float("nan"))
    cpu_grouped_gemm.grouped_mm(a, b, offsets, out=out)
    torch.testing.assert_close(out.double(), _rows_reference(a, b, offsets), rtol=1e-5, atol=1e-5)

    grad = torch.randn(rows, cols)
    weight_grad = torch.full((groups, depth, cols), float("nan"))
    cpu_grouped_gemm.grouped_mm_weight_grad(a, grad, offsets, out=weight_grad)
    torch.testing.assert_close(weight_grad.double(), _weight_grad_reference(a, grad, offsets), rtol=1e-5, atol=1e-5)


def test_strided_operands_and_two_threads():
    """Operands that are views with row strides of their own (a column slice, a weight with padded rows), and a
    problem big enough to split over OpenMP threads, give the per-group products; so does the weight gradient of
    an operand read through a transposed view."""
    torch.manual_seed(1)
    offsets = torch.tensor([100, 100, 380, 512], dtype=torch.int32)
    a = torch.randn(512, 300)[:, 10:266]  # row stride 300
    b = torch.randn(4, 256, 160)[:, :, :144]  # column panels of a padded weight
    grad = torch.randn(144, 512).t()  # a transposed view: rows 1 apart, columns 512
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        out = cpu_grouped_gemm.grouped_mm(a, b, offsets, out=torch.empty(512, 144))
        weight_grad = cpu_grouped_gemm.grouped_mm_weight_grad(a, grad, offsets, out=torch.empty(4, 256, 144))
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(out.double(), _rows_reference(a, b, offsets), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(weight_grad.double(), _weight_grad_reference(a, grad, offsets), rtol=1e-5, atol=1e-4)


def test_an_output_the_kernel_cannot_write_is_refused_with_its_strides():
    offsets = torch.tensor([2, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"contiguous columns; out has strides \(1, 4\)"):
        cpu_grouped_gemm.grouped_mm(torch.randn(4, 3), torch.randn(2, 3, 5), offsets, out=torch.empty(5, 4).t())


def _both_forms(x, w, offsets, a, b):
    return (
        torch.ops.trex.extern_grouped_mm(x, w, offsets),
        torch.ops.trex.extern_grouped_mm_weight_grad(a, b, offsets),
    )


def _operands():
    torch.manual_seed(0)
    offsets = torch.tensor([5, 5, 17, 22], dtype=torch.int64)  # int64: the lowering converts them
    return torch.randn(24, 16), torch.randn(4, 16, 8), offsets, torch.randn(24, 16), torch.randn(24, 8)


def _lowered(policy):
    """Both forms compiled by Inductor under the placement `policy` gives their graph (as InductorBackend.lower
    places a region's grouped GEMMs before compiling it)."""
    from torch._inductor.utils import run_and_get_code
    from torch.fx.experimental.proxy_tensor import make_fx

    from trex.backends.inductor.grouped_mm_lowering import register_grouped_mm_lowerings

    args = _operands()
    register_grouped_mm_lowerings()
    placement = cpu_grouped_gemm.place(make_fx(_both_forms, tracing_mode="fake")(*args), policy)
    torch._dynamo.reset()
    with cpu_grouped_gemm.placing(placement):
        values, code = run_and_get_code(torch.compile(_both_forms, backend="inductor", fullgraph=True), *args)
    return "\n".join(code), values, placement.choices, args


def test_the_trex_policy_lowers_both_forms_to_the_kernel_with_the_groups_products():
    code, (out, weight_grad), choices, (x, w, offsets, a, b) = _lowered("trex")
    assert "extern_kernels.trex_cpu_grouped_mm(" in code, code
    assert "extern_kernels.trex_cpu_grouped_mm_weight_grad(" in code, code
    assert "extern_kernels._grouped_mm(" not in code, code
    assert [c.on_kernel for c in choices] == [True, True] and all(c.aten_us is None for c in choices)
    torch.testing.assert_close(out.double(), _rows_reference(x, w, offsets), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight_grad.double(), _weight_grad_reference(a, b, offsets), rtol=1e-5, atol=1e-5)


def test_the_timed_policy_records_both_timings_and_picks_the_faster():
    code, _, choices, _ = _lowered("timed")
    assert len(choices) == 2
    for choice in choices:
        assert choice.aten_us > 0 and choice.kernel_us > 0
        assert choice.on_kernel == (choice.kernel_us < choice.aten_us)
        call = "trex_cpu_grouped_mm" + ("_weight_grad" if choice.problem.startswith("weight") else "")
        assert (f"extern_kernels.{call}(" in code) == choice.on_kernel, code
    assert "fp32 grouped GEMM problems on trex's kernel (timed here:" in cpu_grouped_gemm.summary(choices)


def test_a_graph_compiled_outside_a_placement_keeps_aten():
    from torch._inductor.utils import run_and_get_code

    from trex.backends.inductor.grouped_mm_lowering import register_grouped_mm_lowerings

    register_grouped_mm_lowerings()
    torch._dynamo.reset()
    _, code = run_and_get_code(torch.compile(_both_forms, backend="inductor", fullgraph=True), *_operands())
    assert "\n".join(code).count("extern_kernels._grouped_mm(") == 2


def test_inductors_graph_cache_keys_the_placement():
    """The same graph placed otherwise is other code: the placement's uuid is in Inductor's cache key, beside a
    post-grad pass the user set."""
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class UsersPass(CustomGraphPass):
        def __call__(self, graph):
            return None

        def uuid(self):
            return "users-pass"

    on = cpu_grouped_gemm.Placement("trex", {("problem",): True})
    off = cpu_grouped_gemm.Placement("aten", {("problem",): False})
    assert on.uuid() != off.uuid()
    with inductor_config.patch(post_grad_custom_post_pass=UsersPass()):
        with cpu_grouped_gemm.placing(on):
            passes = inductor_config.post_grad_custom_post_pass
            assert [p.uuid() for p in passes] == ["users-pass", on.uuid()]
        assert inductor_config.post_grad_custom_post_pass.uuid() == "users-pass"


def test_an_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="cpu_grouped_gemm='fast'.*timed, trex, aten"):
        InductorBackend(cpu_grouped_gemm="fast")


def test_bf16_grouped_gemms_stay_on_aten():
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w, offsets, a, b = (t.to(torch.bfloat16) if t.is_floating_point() else t for t in _operands())
    graph = make_fx(_both_forms, tracing_mode="fake")(x, w, offsets.int(), a, b)
    assert cpu_grouped_gemm.place(graph, "trex").choices == []


@pytest.mark.parametrize("policy", ["trex", "aten"])
def test_tiny_qwen3_moe_trains_like_eager_with_the_kernel_on_and_off(policy, step_matches_eager):
    """One fp32 training step of tiny Qwen3-MoE through trex + Inductor, its expert GEMMs on trex's kernel (all of
    them: forward, input and weight gradients) or on aten's: eager's loss and gradients within fp32 tolerance."""
    from trex.models import build_model, tiny_config

    config = tiny_config("qwen3-moe")
    model = build_model(config, dtype=torch.float32, seed=1)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=[InductorBackend(cpu_grouped_gemm=policy), "eager"])
    step_matches_eager(compiled, model, reference, config, torch.float32)
    notes = [n for g in compiled.trex.graphs for lowering in g.lowerings.values() for n in lowering.notes]
    placed = [n for n in notes if "cpu grouped GEMM:" in n]
    on_kernel = sum(int(n.split("cpu grouped GEMM: ")[1].split(" of ")[0]) for n in placed)
    total = sum(int(n.split(" of ")[1].split(" fp32")[0]) for n in placed)
    # six distinct problems: two forward, two input-gradient, two weight-gradient (every layer has the same)
    assert total == 6 and on_kernel == (total if policy == "trex" else 0), notes
