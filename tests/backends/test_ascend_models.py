"""Tiny DeepSeek-V4, DeepSeek-V3 and Qwen3-MoE compiled with backend=["ascend"] train like eager on CPU
(the torch_npu ops run as their emulations), and the session reports what was emitted and its share."""

from __future__ import annotations

import copy

import pytest
import torch

import trex
from trex.backends.ascend import AscendBackend
from trex.backends.ascend.report import emitted_call_costs, shares
from trex.backends.ascend.schemas import check_call
from trex.models import build_model, tiny_config

# fp32: the emulations compute what eager computes, in another order. bf16: as tests/compiler/test_compile_models.py
# (the fused RMSNorm and token ops round once where eager rounds at each step).
TOLERANCE = {
    torch.float32: dict(loss=(1e-5, 1e-6), grad=(1e-4, 1e-5)),
    torch.bfloat16: dict(loss=(1e-2, 1e-2), grad=(5e-2, 2e-2)),
}
# ops every family must get (its MoE layers), and the extra ones its attention/MLP shapes allow
MOE_OPS = {
    "npu_moe_init_routing_v2",
    "npu_grouped_matmul",
    "npu_grouped_matmul_add_",  # fp32 parameters by default: in place into float32 main_grad, which is .grad
    "npu_moe_token_unpermute",
    "npu_moe_token_unpermute_grad",
    "npu_moe_token_permute_grad_v2",
}
EXTRA_OPS = {
    "qwen3-moe": {
        "npu_swiglu",
        "npu_swiglu_backward",
        "npu_rotary_mul",
        "npu_rotary_mul_backward",
        "npu_moe_gating_top_k_softmax",
        "npu_rms_norm",
        "npu_fusion_attention",
        "npu_fusion_attention_grad",
    },
    "deepseek-v3": {
        "npu_swiglu",
        "npu_swiglu_backward",
        "npu_rms_norm",
        "npu_moe_gating_top_k",
        "npu_moe_gating_top_k_backward",
        "npu_fusion_attention",  # MLA (Dq 24 != Dv 16), lowered before AOTAutograd
        "npu_fusion_attention_grad",
        "npu_rotary_mul",  # its interleaved RoPE, lowered before AOTAutograd too
        "npu_rotary_mul_backward",
    },
    # the eager attention with sinks, sliding window and the compressor's block mask, lowered before AOTAutograd
    # and its interleaved RoPE, lowered before AOTAutograd too: npu_rotary_mul and its backward
    "deepseek-v4": {
        "npu_clipped_swiglu",
        "npu_swiglu_backward",
        "npu_fusion_attention",
        "npu_fusion_attention_grad",
        "npu_rotary_mul",
        "npu_rotary_mul_backward",
    },
}
# the fp32 RMSNorm backward region (bf16 adds casts the pattern does not take)
# (and V4's bf16 RMSNorm, whose weight/cast layout the forward pattern does not take)
FP32_OPS = {
    "qwen3-moe": {"npu_rms_norm_backward"},
    "deepseek-v3": {"npu_rms_norm_backward"},
    "deepseek-v4": {"npu_rms_norm", "npu_rms_norm_backward"},
}
# the MoE layers' fused share on ascend-910c, every fused call priced by its own formula (RESULTS 12.6). The issue's
# goal is 80%: held where the tiny models reach it (fp32: Qwen3-MoE 91.9%, V3 95.8%, V4 81.9%; bf16: Qwen3-MoE 87.9%,
# V3 93.5%); bf16 V4 (74.3%: per MoE layer the clamp/eq/mul of its clamped-SwiGLU backward, whose only shipped op is
# for Ascend 950 and not 910C, the router's int64 ids converted for npu_moe_init_routing_v2, the group ends' cumsum)
# does not, so its floor only guards against regressions
MOE_SHARE_FLOOR = {
    (torch.float32, "qwen3-moe"): 0.80,
    (torch.float32, "deepseek-v3"): 0.80,
    (torch.float32, "deepseek-v4"): 0.80,
    (torch.bfloat16, "qwen3-moe"): 0.80,
    (torch.bfloat16, "deepseek-v3"): 0.80,
    (torch.bfloat16, "deepseek-v4"): 0.70,
}
# regression floors of the other settings (own-formula pricing, RESULTS 12.5: V4 fp32 K-split 73.8%, V4 bf16 with
# publish_grads=False 64.4%; Qwen3-MoE and V3 above the higher floors)
FUNCTIONAL_SHARE_FLOOR = {"qwen3-moe": 0.75, "deepseek-v3": 0.75, "deepseek-v4": 0.70}  # main_grad=False, fp32
MAIN_GRAD_SHARE_FLOOR = {"qwen3-moe": 0.65, "deepseek-v3": 0.65, "deepseek-v4": 0.60}  # publish_grads=False, bf16


def _train_step_matches_eager(family, dtype, backend=None, **config_overrides):
    """One training step against eager; `backend` None is what a user gets from backend=["ascend"]."""
    config = tiny_config(family, **config_overrides)
    model = build_model(config, dtype=dtype, seed=1)
    reference = copy.deepcopy(model)
    compiled = trex.compile(model, backend=[backend or "ascend"])
    input_ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    loss.backward()
    expected = reference(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    expected.backward()
    rtol, atol = TOLERANCE[dtype]["loss"]
    torch.testing.assert_close(loss, expected, rtol=rtol, atol=atol)
    rtol, atol = TOLERANCE[dtype]["grad"]
    megatron = backend is not None and backend.main_grad is not False and not backend.publish_grads
    accumulated = 0
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        grad = p.grad
        if getattr(p, "main_grad", None) is not None:  # the routed experts' weights
            accumulated += 1
            if megatron:  # Megatron's contract: the optimizer reads main_grad
                assert p.grad is None, name
                grad = p.main_grad.to(q.dtype)
            else:  # published: .grad as torch leaves it (fp32: the buffer itself)
                assert p.grad.dtype == q.dtype and (p.grad is p.main_grad) == (dtype == torch.float32), name
        assert (grad is None) == (q.grad is None), name
        if grad is not None:
            torch.testing.assert_close(grad, q.grad, rtol=rtol, atol=atol, msg=lambda m, n=name: f"grad of {n}: {m}")
    in_place = compiled.trex.lowered_ops()["ascend"].count("npu_grouped_matmul_add_")
    assert accumulated == in_place  # one in-place accumulation per expert weight (gate_up, down of each MoE layer)
    assert (accumulated > 0) == uses_main_grad(backend, dtype)
    return compiled


def uses_main_grad(backend, dtype) -> bool:
    """Whether the expert weight gradients accumulate into fp32 main_grad (AscendBackend's `main_grad`: None
    decides by dtype - fp32 parameters, or an optimizer reading main_grad; bf16 with a .grad optimizer: K-split)."""
    main_grad = None if backend is None else backend.main_grad
    if main_grad is not None:
        return main_grad
    return dtype == torch.float32 or (backend is not None and not backend.publish_grads)


def _check_session(compiled, family, dtype=torch.float32, main_grad=None):
    session = compiled.trex
    emitted = session.lowered_ops()
    assert set(emitted) == {"ascend"}
    expected = MOE_OPS | EXTRA_OPS[family] | (FP32_OPS[family] if dtype == torch.float32 else set())
    main_grad = uses_main_grad(None, dtype) if main_grad is None else main_grad
    if not main_grad:  # opted out: each weight gradient one K-split npu_grouped_matmul(group_type=2)
        expected = expected - {"npu_grouped_matmul_add_"}
    assert expected <= set(emitted["ascend"]), expected - set(emitted["ascend"])
    summary = session.summary()
    assert "torch_npu fused ops take" in summary and "ascend-910c" in summary
    backend = next(b for b in session.options.backends if b.name == "ascend")
    reports = [r for r in backend.reports if r.moe_total_s > 0]
    assert reports, "no graph had MoE-layer nodes to price"
    return shares(reports)["moe"]


@pytest.mark.parametrize("family", ["qwen3-moe"])
def test_qwen3_moe_fp32_trains_like_eager_with_torch_npu_ops(family):
    compiled = _train_step_matches_eager(family, torch.float32, num_layers=2)  # two layers keep the default run fast
    assert _check_session(compiled, family) >= MOE_SHARE_FLOOR[torch.float32, family]
    _check_every_emitted_call(compiled)


def _check_every_emitted_call(compiled):
    """Every emitted call in the lowered graphs binds to torch_npu's schema (name, argument names, types) and
    has a price of its own on ascend-910c above 0."""
    graph = compiled.trex.graphs[0]
    checked = 0
    for lowering in graph.lowerings.values():
        for child in lowering.module.children():
            module = getattr(getattr(child, "compiled", None), "module", None)
            for node in module.graph.nodes if module is not None else ():
                if "trex_npu_op" in node.meta:
                    check_call(node.meta["trex_npu_op"], node.args, node.kwargs)
                    checked += 1
            for op, cost in emitted_call_costs(module.graph, "ascend-910c") if module is not None else ():
                assert cost.priced and cost.time_s > 0, (op, cost)  # its own formula, on the 910c profile
    assert checked == sum(len(v) for v in compiled.trex.lowered_ops().values())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["deepseek-v4", "deepseek-v3", "qwen3-moe"])
def test_three_families_train_like_eager_with_torch_npu_ops(family, dtype):
    compiled = _train_step_matches_eager(family, dtype)
    assert _check_session(compiled, family, dtype) >= MOE_SHARE_FLOOR[dtype, family]
    _check_every_emitted_call(compiled)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["deepseek-v4", "deepseek-v3", "qwen3-moe"])
def test_three_families_bf16_megatron_contract_main_grad_only(family):
    """AscendBackend(publish_grads=False): expert weight gradients only in fp32 `main_grad` (.grad None),
    equal to eager's (bf16 tolerances); the MoE layers' share stays above a floor."""
    compiled = _train_step_matches_eager(family, torch.bfloat16, AscendBackend(publish_grads=False))
    assert _check_session(compiled, family, torch.bfloat16, main_grad=True) >= MAIN_GRAD_SHARE_FLOOR[family]
    assert "npu_grouped_matmul_add" not in compiled.trex.lowered_ops()["ascend"]
    _check_every_emitted_call(compiled)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["deepseek-v4", "deepseek-v3", "qwen3-moe"])
def test_three_families_fp32_opted_out_of_main_grad_lower_functionally(family):
    """AscendBackend(main_grad=False): each expert weight gradient one K-split npu_grouped_matmul (group_type=2)
    in the parameter's dtype, no main_grad, no accumulator."""
    compiled = _train_step_matches_eager(family, torch.float32, AscendBackend(main_grad=False))
    assert _check_session(compiled, family, main_grad=False) >= FUNCTIONAL_SHARE_FLOOR[family]
    emitted = compiled.trex.lowered_ops()["ascend"]
    assert "npu_grouped_matmul_add_" not in emitted and "npu_grouped_matmul_add" not in emitted
    _check_every_emitted_call(compiled)
