"""Device profiles: the GEMM model reproduces published measurements, behaves physically, and
profile files are validated field by field."""

import json
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trex.cost_model.devices import (
    BUILTIN_DEVICES,
    MAMF,
    device_profile_from_dict,
    device_profile_to_dict,
    get_device,
    load_device_profile,
    save_device_profile,
)
from trex.cost_model.toml_writer import dumps
from trex.errors import TrexError, UnknownNameError

H100 = BUILTIN_DEVICES["h100"]


@pytest.mark.parametrize("name", ["a100", "h100"])
def test_gemm_model_reproduces_the_published_mamf_at_its_shape(name):
    fraction, shape = MAMF[name]
    assert BUILTIN_DEVICES[name].gemm_efficiency(*shape) == pytest.approx(fraction, rel=0.01)


def test_published_peaks_are_the_datasheet_dense_bf16_values():
    assert BUILTIN_DEVICES["a100"].peak_flops("bf16") == 312e12
    assert H100.peak_flops("bf16") == pytest.approx(989.4e12)
    assert H100.peak_flops("fp8") == pytest.approx(2 * 989.4e12, rel=1e-3)
    assert BUILTIN_DEVICES["ascend-910b1"].peak_flops("bf16") == pytest.approx(373.88e12)
    assert BUILTIN_DEVICES["ascend-910c"].peak_flops() == 2 * BUILTIN_DEVICES["ascend-910c-die"].peak_flops()


dims = st.integers(min_value=1, max_value=20000)


@given(m=dims, n=dims, k=dims, grow=st.integers(min_value=1, max_value=5000), axis=st.sampled_from("mnk"))
def test_gemm_time_never_decreases_when_a_dimension_grows(m, n, k, grow, axis):
    bigger = {"m": m, "n": n, "k": k}
    bigger[axis] += grow
    assert H100.gemm_time(bigger["m"], bigger["n"], bigger["k"]) >= H100.gemm_time(m, n, k)


@given(m=dims, n=dims, k=dims, dtype=st.sampled_from(["bf16", "fp8", "fp32"]))
def test_gemm_never_exceeds_the_peak(m, n, k, dtype):
    assert 0 < H100.gemm_efficiency(m, n, k, dtype) <= 1.0


def test_small_and_skinny_gemms_are_less_efficient_than_large_square_ones():
    large = H100.gemm_efficiency(8192, 8192, 8192)
    assert H100.gemm_efficiency(128, 8192, 8192) < 0.5 * large  # one row of tiles on 132 SMs
    assert H100.gemm_efficiency(8192, 8192, 64) < 0.6 * large  # pipeline fill dominates a short K
    assert H100.gemm_efficiency(8192, 8192, 8192) > 0.75


def test_accumulating_into_fp32_main_grads_slows_a_weight_gradient():
    assert H100.gemm_time(7168, 4096, 2048, out_bytes=8.0) > H100.gemm_time(7168, 4096, 2048, out_bytes=2.0)


def test_split_accumulation_stretches_only_the_fp8_main_loop():
    # Hopper FP8 GEMMs that promote partial sums to FP32 (per-tensor recipes' dgrad/wgrad) run 1.15x the
    # main loop of a fast-accumulating one; a large GEMM is main-loop bound, so it takes ~1.15x as long
    assert H100.gemm.split_accumulation == pytest.approx(1.15)
    fast, split = (
        H100.gemm_time(8192, 8192, 8192, "fp8"),
        H100.gemm_time(8192, 8192, 8192, "fp8", split_accumulation=True),
    )
    assert split / fast == pytest.approx(1.15, rel=0.02)
    assert H100.gemm_time(8192, 8192, 8192, "bf16", split_accumulation=True) == H100.gemm_time(8192, 8192, 8192, "bf16")
    assert BUILTIN_DEVICES["a100"].gemm.split_accumulation == 1.0  # no FP8 there


def test_memory_bound_time_is_latency_plus_bandwidth():
    one_gb = 1e9
    expected = H100.kernel_overhead_s + one_gb / (H100.hbm_bandwidth_gbs * 1e9 * H100.memory_efficiency)
    assert H100.memory_time(one_gb) == pytest.approx(expected)


def test_fp8_on_a100_names_the_supported_precisions():
    with pytest.raises(TrexError, match="no fp8 throughput.*bf16"):
        BUILTIN_DEVICES["a100"].peak_flops("fp8")


def test_unknown_device_lists_the_valid_ones():
    with pytest.raises(UnknownNameError) as error:
        get_device("h1000")
    assert "h100" in str(error.value) and "ascend-910b" in str(error.value)


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_profiles_round_trip_through_files(tmp_path, suffix):
    path = save_device_profile(H100, tmp_path / f"h100{suffix}")
    assert load_device_profile(path) == H100


def _h100_table() -> dict:
    return json.loads(json.dumps(device_profile_to_dict(H100)))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["device"].pop("memory_gib"), "'device.memory_gib' is missing"),
        (
            lambda d: d["device"].__setitem__("hbm_bandwidth_gbs", -3),
            "'device.hbm_bandwidth_gbs' must be a positive number",
        ),
        (
            lambda d: d["device"]["gemm"]["efficiency"].__setitem__("bf16", 1.7),
            "'device.gemm.efficiency.bf16' must be at most 1",
        ),
        (
            lambda d: d["device"].__setitem__("memroy_gib", 80),
            "'device.memroy_gib' is not a profile field; valid fields here:.*memory_gib",
        ),
        (
            lambda d: d["device"]["peak_tflops"].__setitem__("int4", 10.0),
            "'device.peak_tflops.int4' is not a known dtype",
        ),
        (
            lambda d: d["device"]["gemm"].__setitem__("compute_units", 0),
            "'device.gemm.compute_units' must be a positive integer",
        ),
        (lambda d: d["device"]["gemm"]["efficiency"].pop("fp8"), "'device.gemm.efficiency' lacks fp8"),
        (lambda d: d["device"].__setitem__("name", 7), "'device.name' has type int"),
        (
            lambda d: d["device"]["gemm"].__setitem__("split_accumulation", 0.9),
            "'device.gemm.split_accumulation' must be >= 1",
        ),
        (
            lambda d: d["device"]["gemm"].__setitem__("launch_per_group", "yes"),
            "'device.gemm.launch_per_group' must be true or false",
        ),
    ],
)
def test_bad_profiles_name_the_field_and_the_fix(tmp_path, edit, message):
    data = _h100_table()
    edit(data)
    path = tmp_path / "bad.toml"
    path.write_text(dumps(data))
    with pytest.raises(TrexError, match=message):
        load_device_profile(path)


def test_a_syntax_error_in_a_profile_says_where(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('[device]\nname = "x"\nmemory_gib = = 3\n')
    with pytest.raises(TrexError, match=r"broken.toml: not valid TOML \(.*line 3"):
        load_device_profile(path)
    json_path = tmp_path / "broken.json"
    json_path.write_text('{"device": {"name": "x",}}')
    with pytest.raises(TrexError, match="not valid JSON.*line 1"):
        load_device_profile(json_path)


def test_a_missing_profile_file_says_how_to_create_one(tmp_path):
    with pytest.raises(TrexError, match="does not exist.*trex calibrate"):
        load_device_profile(tmp_path / "nope.toml")


def test_toml_writer_output_reads_back_identically():
    data = device_profile_to_dict(BUILTIN_DEVICES["ascend-910b"])
    assert tomllib.loads(dumps(data)) == json.loads(json.dumps(data))


def test_a_user_profile_without_optional_tables_gets_defaults():
    profile = device_profile_from_dict(
        {
            "device": {
                "name": "npu-x",
                "memory_gib": 32,
                "hbm_bandwidth_gbs": 1000,
                "peak_tflops": {"bf16": 200},
                "gemm": {"compute_units": 30, "efficiency": {"bf16": 0.7}},
            }
        }
    )
    assert profile.attention.forward_efficiency > 0 and profile.gemm.tile_m == 128
    assert profile.gemm_efficiency(4096, 4096, 4096) < 0.7


def test_an_uncalibrated_cpu_pads_rows_to_a_register_tile_not_a_thread_block():
    from trex.cost_model.devices import _uncalibrated_cpu

    cpu = _uncalibrated_cpu()
    # 32 rows of an expert GEMM are not priced as 64 (a 64-row tile would make them equal)
    assert cpu.gemm_time(32, 288, 512, "fp32") < 0.75 * cpu.gemm_time(64, 288, 512, "fp32")
    # one launch per group: torch's CPU grouped GEMM is a loop of GEMMs
    launch = cpu.gemm_launch_s("fp32")
    assert cpu.gemm_launch_s("fp32", 16) == pytest.approx(16 * launch)
    assert H100.gemm_launch_s("bf16", 16) == H100.gemm_launch_s("bf16")  # a GPU grouped kernel is one launch


def test_launches_per_group_survive_a_file_and_default_to_the_cpu(tmp_path):
    from dataclasses import replace

    from trex.cost_model.devices import _uncalibrated_cpu

    cpu = _uncalibrated_cpu()
    assert load_device_profile(save_device_profile(cpu, tmp_path / "cpu.toml")) == cpu
    data = device_profile_to_dict(cpu)
    data["device"]["gemm"].pop("launch_per_group")
    assert device_profile_from_dict(data).gemm.launch_per_group  # an older cpu profile file
    other = replace(cpu, name="my-cpu", gemm=replace(cpu.gemm, launch_per_group=False))
    assert not load_device_profile(save_device_profile(other, tmp_path / "other.toml")).gemm.launch_per_group
