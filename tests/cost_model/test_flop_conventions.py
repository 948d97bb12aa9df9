"""FLOP conventions: Megatron's per-GEMM count, the 6N + attention count, by hand."""

import pytest

from trex.cost_model.flops import megatron_flops_per_token, narayanan_gpt_flops_per_iteration, six_n_flops_per_token
from trex.cost_model.model_spec import Linear, get_model_spec


def test_a_linear_costs_two_flops_per_multiply_accumulate():
    assert Linear("w", 4096, 11008).flops_per_token == 2 * 4096 * 11008
    assert Linear("w", 512, 1024, groups=8).flops_per_token == 2 * 8 * 512 * 1024


@pytest.mark.parametrize(
    "name, layers, hidden",
    [("gpt-22b", 48, 6144), ("gpt-175b", 96, 12288), ("gpt-530b", 105, 20480), ("gpt-1t", 128, 25600)],
)
def test_megatron_gpt_formula_without_causal_halving(name, layers, hidden):
    spec = get_model_spec(name)
    per_iteration = megatron_flops_per_token(spec, 2048, causal_halving=False) * 4 * 2048
    assert per_iteration == pytest.approx(narayanan_gpt_flops_per_iteration(4, 2048, layers, hidden, 51200), rel=1e-9)


def test_korthikanti_22b_step_implies_the_published_mfu():
    # Korthikanti et al. Table 4: 1.10 s per step on 8 A100, MFU 41.5%
    flops = narayanan_gpt_flops_per_iteration(4, 2048, 48, 6144, 51200)
    assert flops / 1.10 / 8 / 312e12 == pytest.approx(0.415, abs=0.005)


def test_deepseek_v3_is_about_260_gflop_per_token_at_4096_with_mtp():
    # NVIDIA: 338 TFLOP/s at 1297 tokens/s/GPU -> 260.6 GFLOP/token
    flops = megatron_flops_per_token(get_model_spec("deepseek-v3"), 4096)
    assert flops == pytest.approx(338e12 / 1297, rel=0.01)


def test_qwen3_235b_megatron_count_matches_the_modelzoo_step():
    # ModelZoo: 19.7 s per step at 245 TFLOP/s per GPU on 256 H100, GBS 2048 x 4096 tokens
    flops = megatron_flops_per_token(get_model_spec("qwen3-235b-a22b"), 4096)
    assert flops == pytest.approx(245e12 * 256 * 19.7 / (2048 * 4096), rel=0.01)


def test_six_n_convention_is_six_times_active_params_plus_attention():
    spec = get_model_spec("gpt-175b")
    n = sum(layer.active_params(spec.hidden_size) for layer in spec.layers) + spec.vocab_size * spec.hidden_size
    attention = 96 * 6 * 96 * (128 + 128) * 2048
    assert six_n_flops_per_token(spec, 2048) == pytest.approx(6 * n + attention)


def test_causal_halving_only_changes_the_attention_term():
    spec = get_model_spec("qwen3-235b-a22b")
    full, halved = megatron_flops_per_token(spec, 4096, causal_halving=False), megatron_flops_per_token(spec, 4096)
    attention = 3 * 94 * 2 * 64 * 256 * 4096 / 2
    assert full - halved == pytest.approx(attention)
