"""ModelSpec: parameter counts match the published model cards; configs of every family load."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trex.cost_model.model_spec import AttentionCore, get_model_spec, spec_from_config
from trex.errors import TrexError, UnknownNameError


@pytest.mark.parametrize(
    "name, total, active",
    [
        ("deepseek-v3", 671e9, 37e9),  # DeepSeek-V3 report: 671B total, 37B activated
        ("qwen3-235b-a22b", 235e9, 22e9),  # Qwen3 model card
        ("deepseek-v4-flash", 284e9, 13e9),  # devices.md: ~284B / ~13B
        ("deepseek-v4-pro", 1.6e12, 49e9),  # ~1.6T / ~49B
        ("gpt-175b", 175e9, 175e9),
        ("gpt-1t", 1.0e12, 1.0e12),
        ("pangu-ultra-135b", 135e9, 135e9),
        ("llama3-70b", 70.6e9, 70.6e9),  # Llama 3 model card: 70.6B
        ("llama3.1-405b", 405.9e9, 405.9e9),  # 405.9B
    ],
)
def test_parameter_counts_match_the_published_sizes(name, total, active):
    spec = get_model_spec(name)
    assert spec.total_params == pytest.approx(total, rel=0.03)
    assert spec.active_params == pytest.approx(active, rel=0.07)  # cards round, and differ on counting embeddings


def test_deepseek_v3_structure():
    spec = get_model_spec("deepseek-v3")
    assert [layer.kind for layer in spec.layers[:4]] == ["dense", "dense", "dense", "moe"]
    assert len(spec.mtp_layers) == 1
    moe = spec.layers[3].moe
    assert (moe.num_experts, moe.top_k, moe.expert_ffn, moe.shared_ffn) == (256, 8, 2048, 2048)
    # MTP module: 14B with the shared embedding and head (V3 report); 11.6B without them
    assert spec.mtp_params + 2 * spec.vocab_size * spec.hidden_size == pytest.approx(14e9, rel=0.05)


def test_deepseek_v4_layer_kinds_follow_the_config_schedule():
    spec = get_model_spec("deepseek-v4-flash")
    counts = {kind: sum(layer.kind == kind for layer in spec.layers) for kind in spec.layer_kinds}
    assert counts == {"hca+hash_moe": 3, "csa+moe": 20, "hca+moe": 20, "mtp": 0}
    assert spec.optimizer == "muon" and spec.residual_streams == 4
    csa = spec.layer_kinds["csa+moe"]
    assert {core.name for core in csa.attention} == {"attention", "indexer"}


def test_a_transformers_config_json_is_accepted(tmp_path):
    config = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = get_model_spec(path)
    assert spec.total_params == pytest.approx(8.03e9, rel=0.01)  # Llama-3-8B
    assert spec.family == "llama" and spec.layers[0].moe is None


def test_gpt_oss_alternates_sliding_and_full_attention_with_sinks():
    # gpt-oss model card: 116.83B parameters, 5.13B active per token (without the input embedding)
    spec = get_model_spec("gpt-oss-120b")
    assert spec.total_params == pytest.approx(116.83e9, rel=0.005)
    assert spec.active_params - spec.vocab_size * spec.hidden_size == pytest.approx(5.13e9, rel=0.01)
    assert [layer.kind for layer in spec.layers[:4]] == ["moe+swa", "moe+full", "moe+swa", "moe+full"]
    swa, full = spec.layer_kinds["moe+swa"].attention[0], spec.layer_kinds["moe+full"].attention[0]
    assert (swa.window, full.window, swa.sinks, full.sinks) == (128, None, True, True)
    assert swa.keys_per_query(4096) < 128 < full.keys_per_query(4096)
    moe = spec.layers[0].moe
    assert (moe.num_experts, moe.top_k, moe.expert_ffn) == (128, 4, 2880)
    # the same structure from transformers' own config class, whose defaults are the 120B model
    from transformers import GptOssConfig

    assert spec_from_config(GptOssConfig(), "gpt-oss").total_params == pytest.approx(spec.total_params, rel=1e-6)


def test_mixtral_config_builds_a_moe_spec():
    from transformers import MixtralConfig

    spec = spec_from_config(MixtralConfig(), "mixtral-8x7b")
    assert spec.layers[0].moe.num_experts == 8 and spec.layers[0].moe.top_k == 2
    assert spec.total_params == pytest.approx(46.7e9, rel=0.02)
    assert spec.active_params == pytest.approx(12.9e9, rel=0.03)


def test_qwen2_moe_shared_expert_and_sparse_step():
    from transformers import Qwen2MoeConfig

    spec = spec_from_config(Qwen2MoeConfig(decoder_sparse_step=2, num_hidden_layers=4))
    assert [layer.kind for layer in spec.layers] == ["dense", "moe", "dense", "moe"]
    assert spec.layers[1].moe.shared_ffn == Qwen2MoeConfig().shared_expert_intermediate_size


def test_unknown_model_lists_valid_names():
    with pytest.raises(UnknownNameError) as error:
        get_model_spec("gpt-17b")
    assert "gpt-175b" in str(error.value) and "deepseek-v3" in str(error.value)


def test_an_unsupported_family_says_which_are_supported():
    with pytest.raises(TrexError, match="cannot describe model_type 'whisper'.*deepseek_v3"):
        spec_from_config({"model_type": "whisper", "d_model": 512})


@given(
    seq=st.integers(1, 600),
    window=st.one_of(st.none(), st.integers(1, 200)),
    rate=st.one_of(st.none(), st.integers(1, 16)),
    topk=st.one_of(st.none(), st.integers(1, 40)),
)
def test_keys_per_query_equals_the_mask_count(seq, window, rate, topk):
    core = AttentionCore("a", 1, 1, 8, 8, window=window, compress_rate=rate, compress_topk=topk if rate else None)
    brute = 0
    for i in range(seq):
        local = min(i + 1, window) if window is not None else i + 1
        compressed = 0 if not rate else ((i + 1) // rate if topk is None else min(topk, (i + 1) // rate))
        brute += local + compressed
    assert core.keys_per_query(seq) == pytest.approx(brute / seq)


def test_an_unknown_family_is_priced_as_llama_like_and_every_estimate_says_so():
    from trex.cost_model import estimate_step, get_cluster, parse_plan

    config = {
        "model_type": "bert",
        "hidden_size": 768,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "vocab_size": 30522,
        "intermediate_size": 3072,
    }
    spec = spec_from_config(config, "bert-like")
    (assumed,) = spec.assumptions
    assert "model_type 'bert' is not a family trex knows" in assumed and "Llama-like decoder" in assumed
    estimate = estimate_step(spec, get_cluster("h100", 8), parse_plan("tp=1", seq=512, gbs=8))
    assert assumed in estimate.notes and assumed in estimate.to_dict()["notes"]
    assert spec_from_config({**config, "model_type": "llama"}, "llama").assumptions == ()
