"""`Plan`: one serializable object - printable, JSON round-trip, diffable, checked against a model."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trex.cost_model import ParallelConfig, estimate_step, get_cluster, get_model_spec
from trex.errors import TrexError
from trex.plan import ModelShape, Plan, Prediction

V3 = get_model_spec("deepseek-v3")


def plan_for(parallel: ParallelConfig, devices: int = 1024, prediction: Prediction | None = None) -> Plan:
    return Plan(ModelShape.of(V3), "h100", devices, "h100", parallel, prediction, "test")


@st.composite
def v3_plans(draw) -> Plan:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4, 8]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    chunks = pp * vpp
    cuts = sorted(draw(st.lists(st.integers(0, 61), min_size=chunks - 1, max_size=chunks - 1)))
    split = tuple(b - a for a, b in zip([0, *cuts], [*cuts, 61]))
    parallel = ParallelConfig(
        tp=tp,
        pp=pp,
        vpp=vpp,
        ep=draw(st.sampled_from([1, 8, 64])),
        etp=1,
        cp=1,
        dp=1024 // (tp * pp),
        zero=draw(st.integers(0, 3)),
        seq=draw(st.sampled_from([2048, 4096])),
        gbs=draw(st.sampled_from([1024, 8192])),
        mbs=draw(st.sampled_from([1, 2])),
        recompute=draw(st.sampled_from(["none", "full", "selective:mla_up_proj+mlp"])),
        layers_per_chunk=split,
        dispatcher=draw(st.sampled_from(["alltoall", "deepep"])),
        moe_imbalance=draw(st.floats(1.0, 2.0)),
    )
    prediction = None
    if draw(st.booleans()):
        prediction = Prediction(
            draw(st.floats(0.1, 100)),
            draw(st.floats(0, 1)),
            0.3,
            1234.5,
            300.0,
            {"total": 60.5, "capacity": 77.0, "weights": 10.0},
            {"compute": 10.0, "bubble": 0.5},
            draw(st.booleans()),
        )
    return plan_for(parallel, prediction=prediction)


@given(v3_plans())
def test_json_round_trip_gives_the_same_plan(plan):
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert again.diff(plan) == []


@given(v3_plans(), v3_plans())
def test_diff_lists_exactly_the_fields_that_differ(a, b):
    changes = {c.field for c in a.diff(b)}
    flat_a, flat_b = json.loads(a.to_json()), json.loads(b.to_json())
    for key in ("tp", "pp", "zero", "mbs", "recompute"):
        assert (f"parallel.{key}" in changes) == (flat_a["parallel"][key] != flat_b["parallel"][key])
    assert (a == b) == (not changes)


def test_a_plan_prints_degrees_stages_and_prediction():
    spec, cluster = get_model_spec("deepseek-v3"), get_cluster("h100", 1024)
    parallel = ParallelConfig(tp=2, pp=8, vpp=4, ep=64, seq=4096, gbs=8192, precision="fp8").with_devices(1024)
    estimate = estimate_step(spec, cluster, parallel)
    plan = Plan(
        ModelShape.of(spec), cluster.name, 1024, cluster.device.name, estimate.plan, Prediction.of(estimate), "test"
    )
    text = str(plan)
    assert "tp=2" in text and "pp=8, vpp=4" in text and "ep=64" in text and "dp=64" in text and "ZeRO-1" in text
    assert (
        "stage 0   4 chunks: layers 0, 15-16, 31-32, 47-48 +embedding" in text
    )  # Megatron's even split: 32 chunks of 1-2 layers
    assert f"{estimate.step_time_s:.3f} s/step" in text and f"MFU {estimate.mfu:.1%}" in text
    assert len(plan.stages()) == 8 and all(len(chunks) == 4 for chunks in plan.stages())


def test_inconsistent_plans_are_refused_with_the_numbers():
    with pytest.raises(TrexError, match=r"tp\*pp\*cp\*dp = 2\*8\*1\*32 = 512 differs from the plan's 1024 devices"):
        plan_for(ParallelConfig(tp=2, pp=8, dp=32))
    with pytest.raises(TrexError, match="places 60 layers; the model has 61"):
        plan_for(ParallelConfig(tp=1, pp=2, dp=512, layers_per_chunk=(30, 30)))


def test_loading_a_bad_file_says_what_is_wrong(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    with pytest.raises(TrexError, match="not valid JSON"):
        Plan.load(path)
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(TrexError, match="not a trex plan"):
        Plan.load(path)
    with pytest.raises(TrexError, match="does not exist"):
        Plan.load(tmp_path / "missing.json")
    good = plan_for(ParallelConfig(tp=1, pp=2, dp=512, layers_per_chunk=(30, 31))).to_dict()
    good["stages"][0]["chunks"][0]["layers"] = [0, 29]
    path.write_text(json.dumps(good))
    with pytest.raises(TrexError, match="'stages' list does not match"):
        Plan.load(path)
    good = plan_for(ParallelConfig(tp=1, pp=2, dp=512)).to_dict()
    good["parallel"]["tensor_parallel"] = 4
    path.write_text(json.dumps(good))
    with pytest.raises(TrexError, match="unknown plan field"):
        Plan.load(path)


def test_a_plan_for_another_model_is_rejected_with_the_reason():
    plan = plan_for(ParallelConfig(tp=1, pp=1, ep=64, dp=1024))
    qwen = get_model_spec("qwen3-235b-a22b")
    problems = plan.check_model(qwen)
    assert "the plan was made for 61 decoder layers, the model has 94" in problems
    assert "the plan was made for 256 routed experts, the model has 128" in problems
    # same layer count, experts not divisible by ep
    v3_96 = dataclasses.replace(V3, layers=V3.layers)
    odd = Plan(ModelShape.of(v3_96), "h100", 1024, "h100", ParallelConfig(tp=1, pp=1, ep=3, dp=1024), None, "test")
    assert "ep=3 does not divide the 256 experts" in odd.check_model(V3)


def test_plan_and_the_planner_are_exported_from_trex():
    import trex
    from trex.plan import Plan as PlanType
    from trex.planner import plan_parallel

    assert trex.Plan is PlanType and trex.plan_parallel is plan_parallel
    assert {"Plan", "plan_parallel"} <= set(trex.__all__)


def test_a_chunk_without_decoder_layers_prints_as_empty():
    split = (0, *([2] * 30), 1)  # 32 chunks; the first holds only the embedding
    parallel = ParallelConfig(tp=2, pp=8, vpp=4, ep=64, seq=4096, gbs=8192, layers_per_chunk=split).with_devices(1024)
    text = str(plan_for(parallel))
    assert "stage 0   4 chunks: layers (empty), 14-15, 30-31, 46-47 +embedding" in text
    assert "stage 7   4 chunks: layers 12-13, 28-29, 44-45, 60 +head" in text
