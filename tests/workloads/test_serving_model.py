"""Instance model: KV-cache layouts per attention family, memory feasibility, step latency shape."""

from __future__ import annotations

import pytest

from trex.cost_model.model_spec import get_model_spec
from trex.workloads.serving.cluster_spec import cluster_from_dict
from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.instance_model import InstanceModel
from trex.workloads.serving.kv_cache import kv_layout


def machine(device: str, count: int = 8):
    return cluster_from_dict({"machines": [{"device": device, "count": count}]}).machines[0]


def test_gqa_kv_is_two_heads_per_kv_head_per_layer():
    spec = get_model_spec("llama3-70b")  # 80 layers, 8 KV heads of 128
    assert kv_layout(spec, tp=1).bytes_for(1000) == 80 * 2 * 8 * 128 * 2 * 1000
    assert kv_layout(spec, tp=8).bytes_for(1000) == 80 * 2 * 1 * 128 * 2 * 1000  # heads split over TP
    assert kv_layout(spec, tp=8, dtype="fp8").bytes_for(1000) == 80 * 2 * 128 * 1000


def test_mla_caches_the_latent_replicated_over_tp():
    spec = get_model_spec("deepseek-v3")  # kv_lora_rank 512 + rope 64, 61 layers
    layout = kv_layout(spec, tp=8)
    assert layout.kind == "mla-latent"
    assert layout.bytes_for(1) == 61 * (512 + 64) * 2
    assert kv_layout(spec, tp=1).bytes_for(100) == layout.bytes_for(100)


def test_v4_compressed_kv_grows_slower_than_context():
    layout = kv_layout(get_model_spec("deepseek-v4-flash"))
    assert layout.kind == "v4-compressed"
    short, long = layout.bytes_per_token(1024), layout.bytes_per_token(65536)
    assert long < short  # the sliding window stops growing; only compressed entries do
    assert layout.bytes_for(65536) < 65536 * layout.bytes_per_token(128)


def test_model_that_does_not_fit_says_what_takes_the_memory():
    instance = InstanceModel(get_model_spec("llama3-70b"), machine("h100"), tp=1)
    assert not instance.memory.fits
    assert "weights 131.4 GiB" in instance.memory.explain()
    assert InstanceModel(get_model_spec("llama3-70b"), machine("h100"), tp=4).memory.fits


def test_weights_split_over_tp():
    spec = get_model_spec("llama3-70b")
    one, eight = (InstanceModel(spec, machine("h100"), tp=tp).weight_bytes for tp in (1, 8))
    assert one == pytest.approx(spec.total_params * 2, rel=0.01)
    assert eight == pytest.approx(one / 8, rel=0.02)


def test_decode_is_bandwidth_bound_and_prefill_compute_bound():
    instance = InstanceModel(get_model_spec("llama3-70b"), machine("h100"), tp=4)
    decode_1, decode_32 = instance.decode_step_s(1, 1024), instance.decode_step_s(32, 32 * 1024)
    assert decode_32 < 2 * decode_1  # 32x the tokens for much less than 2x the time: weights dominate
    prefill_2k, prefill_8k = instance.prefill_step_s([2048]), instance.prefill_step_s([2048] * 4)
    assert prefill_8k > 3 * prefill_2k  # compute-bound: time follows tokens
    slower = InstanceModel(get_model_spec("llama3-70b"), machine("a100"), tp=4)
    assert slower.decode_step_s(1, 1024) > decode_1 and slower.prefill_step_s([2048]) > prefill_2k


def test_unknown_device_type_is_a_clear_error():
    with pytest.raises(ServingError, match=r"machines\[0\].*unknown device 'h1000'.*did you mean 'h100'"):
        cluster_from_dict({"machines": [{"device": "h1000", "count": 8}]}, "mix.toml")


def test_cluster_file_field_errors_name_the_field():
    with pytest.raises(ServingError, match="count must be a positive integer"):
        cluster_from_dict({"machines": [{"device": "h100", "count": 0}]})
    with pytest.raises(ServingError, match="unknown field.*gpus"):
        cluster_from_dict({"machines": [{"device": "h100", "count": 8, "gpus": 8}]})
    with pytest.raises(ServingError, match=r"\[\[machines\]\]"):
        cluster_from_dict({})


def test_tp_stays_inside_a_node_and_fp8_needs_fp8_gemms():
    m = cluster_from_dict({"machines": [{"device": "ascend-910b", "count": 16, "devices_per_node": 4}]}).machines[0]
    assert m.tp_degrees() == [1, 2, 4]
    with pytest.raises(ServingError, match="no fp8 GEMMs"):
        InstanceModel(get_model_spec("llama3-70b"), m, tp=4, weight_dtype="fp8")
    with pytest.raises(ServingError, match="TP degree 8 is not possible"):
        InstanceModel(get_model_spec("llama3-70b"), m, tp=8)
