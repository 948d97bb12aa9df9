"""Memory model: Korthikanti's activation counts, ZeRO sharding, in-flight micro-batches."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trex.cost_model.catalog import get_cluster
from trex.cost_model.layer_cost import CostContext, layer_cost
from trex.cost_model.memory import ParamCounts, static_memory
from trex.cost_model.model_spec import get_model_spec
from trex.cost_model.parallel import ParallelConfig
from trex.cost_model.step import estimate_step

GPT = get_model_spec("gpt-175b")
S, B, H, A, T = 2048, 1, 12288, 96, 8


def _saved(recompute: str) -> float:
    plan = ParallelConfig(tp=T, pp=8, dp=1, seq=S, mbs=B, gbs=64, recompute=recompute, attention_kernel="unfused")
    ctx = CostContext.of(plan, get_cluster("a100", 64))
    return layer_cost(GPT.layers[0], H, ctx).saved_bytes


def test_gpt_layer_keeps_korthikantis_34sbh_plus_5as2b_over_t():
    # Korthikanti et al. 2022, Sec. 4.2.2: tensor + sequence parallel, no recompute
    expected = S * B * H * 34 / T + 5 * A * S * S * B / T
    assert _saved("none") == pytest.approx(expected, rel=0.002)


def test_selective_recompute_drops_exactly_the_attention_core():
    assert _saved("selective") == pytest.approx(S * B * H * 34 / T, rel=0.002)


def test_full_recompute_keeps_only_the_layer_input():
    assert _saved("full") == pytest.approx(2 * S * B * H / T)


params = st.builds(
    ParamCounts, dense=st.floats(1e6, 1e11), expert=st.floats(0, 1e12), muon=st.just(0.0), fp8_gemm=st.just(0.0)
)


@given(
    params=params, dp=st.integers(2, 512), edp=st.integers(1, 64), precision=st.sampled_from(["bf16", "fp8", "fp32"])
)
def test_memory_never_grows_with_the_zero_stage(params, dp, edp, precision):
    totals = [
        sum(
            static_memory(
                params,
                dp=dp,
                edp=edp,
                zero=zero,
                precision=precision,
                grad_dtype="fp32",
                state_dtype="fp32",
                muon=False,
            )
        )
        for zero in range(4)
    ]
    assert totals == sorted(totals, reverse=True)
    assert totals[3] < totals[0]


def test_mixed_precision_adam_is_18_bytes_per_parameter_and_zero1_shards_12():
    p = ParamCounts(dense=1e9)
    assert sum(
        static_memory(p, dp=1, edp=1, zero=0, precision="bf16", grad_dtype="fp32", state_dtype="fp32", muon=False)
    ) == pytest.approx(18e9)
    assert sum(
        static_memory(p, dp=8, edp=1, zero=1, precision="bf16", grad_dtype="fp32", state_dtype="fp32", muon=False)
    ) == pytest.approx(6e9 + 12e9 / 8)


def test_muon_keeps_one_moment_instead_of_two():
    p = ParamCounts(dense=1e9, muon=1e9)
    adam = static_memory(p, dp=1, edp=1, zero=0, precision="bf16", grad_dtype="fp32", state_dtype="fp32", muon=False)[2]
    muon = static_memory(p, dp=1, edp=1, zero=0, precision="bf16", grad_dtype="fp32", state_dtype="fp32", muon=True)[2]
    assert adam - muon == pytest.approx(4e9)


def test_moe_imbalance_and_vpp_raise_activation_memory():
    spec = get_model_spec("qwen3-235b-a22b")
    cluster = get_cluster("h100", 256)
    base = ParallelConfig(tp=2, pp=8, vpp=1, ep=32, seq=4096, gbs=2048)
    balanced = estimate_step(spec, cluster, base).memory.activations
    skewed = estimate_step(spec, cluster, ParallelConfig(**{**base.to_dict(), "moe_imbalance": 1.5})).memory.activations
    interleaved = estimate_step(spec, cluster, ParallelConfig(**{**base.to_dict(), "vpp": 4})).memory.activations
    assert skewed > balanced and interleaved > balanced
