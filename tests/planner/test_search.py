"""The search returns the fastest plan of its space, and only plans that are valid and fit."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trex.cost_model import ParallelConfig, estimate_step, get_cluster, get_model_spec, validate
from trex.cost_model.model_spec import spec_from_config
from trex.models import tiny_config
from trex.planner import SearchSpace, plan_parallel, search
from trex.planner.pricing import Layout, PricedLayers
from trex.planner.search import solve_split
from trex.planner.space import layer_choices, pipeline_options, recompute_options, zero_options
from trex.planner.stage_split import even_split
from trex.planner.topology import placement_problems


def exhaustive_best(spec, cluster, template, space) -> float:
    """Price every candidate of the space with estimate_step (optimal split and Megatron's even split)."""
    best = float("inf")
    for base in layer_choices(spec, cluster, template, space):
        for policy in recompute_options(spec, space, template):
            choice = dataclasses.replace(base, recompute=policy)
            layers = PricedLayers(spec, cluster, template, choice)
            for option in pipeline_options(spec, cluster, template, space, choice):
                for zero in zero_options(space, choice, option):
                    layout = Layout(layers, option.pp, option.vpp, zero, cluster.devices)
                    plan = dataclasses.replace(
                        template,
                        tp=choice.tp,
                        cp=choice.cp,
                        ep=choice.ep,
                        etp=choice.etp,
                        mbs=choice.mbs,
                        recompute=policy,
                        pp=option.pp,
                        vpp=option.vpp,
                        dp=option.dp,
                        zero=zero,
                    )
                    splits = {even_split(spec.num_layers, option.pp * option.vpp)}
                    split = solve_split(layout, memory=True, node_budget=0, thorough=True)
                    if split is not None:
                        splits.add(split.layers_per_chunk)
                    for layers_per_chunk in splits:
                        estimate = estimate_step(
                            spec, cluster, dataclasses.replace(plan, layers_per_chunk=layers_per_chunk)
                        )
                        if estimate.feasible:
                            best = min(best, estimate.step_time_s)
    return best


@pytest.mark.parametrize(
    "name, cluster, devices, seq, gbs, fix",
    [
        ("gpt-22b", "a100", 16, 2048, 16, "mbs=1/2,vpp=1/2/3"),
        ("tiny-deepseek-v3", "h100", 8, 256, 16, "vpp=1/2,mbs=1/2"),
    ],
)
def test_branch_and_bound_finds_the_plan_exhaustive_pricing_finds(name, cluster, devices, seq, gbs, fix):
    spec = spec_from_config(tiny_config("deepseek-v3"), name) if name.startswith("tiny") else get_model_spec(name)
    target = get_cluster(cluster, devices)
    template = ParallelConfig(seq=seq, gbs=gbs)
    space = SearchSpace.parse(fix)
    result = search(spec, target, template, space, runners_up=2, workers=1)
    assert result.best is not None
    assert result.best.step_time_s <= exhaustive_best(spec, target, template, space) * (1 + 1e-9)
    assert result.stats.pruned > 0  # the bounds did cut the space


def returned(result):
    return [c for c in [result.best, *result.runners_up] if c is not None]


@settings(max_examples=8)
@given(
    st.sampled_from(["deepseek-v3", "qwen3-moe", "deepseek-v4"]),
    st.sampled_from([("h100", 8), ("h100", 16), ("ascend-910b", 16), ("cloudmatrix384", 32)]),
    st.sampled_from([8, 16, 48]),
    st.sampled_from(["", "recompute=none/full", "zero=1"]),
)
def test_every_returned_plan_is_valid_fits_memory_and_is_placed_well(family, target, gbs, fix):
    spec = spec_from_config(tiny_config(family), f"tiny-{family}")
    cluster = get_cluster(*target)
    result = search(spec, cluster, ParallelConfig(seq=256, gbs=gbs), SearchSpace.parse(fix), runners_up=2, workers=1)
    for candidate in returned(result):
        plan = candidate.plan
        assert validate(plan, spec, cluster.devices) == []
        assert plan.tp * plan.pp * plan.cp * plan.dp == cluster.devices
        assert placement_problems(cluster, plan.tp, plan.ep, plan.etp) == []
        again = estimate_step(spec, cluster, plan)
        assert again.feasible and again.step_time_s == pytest.approx(candidate.step_time_s)
    times = [c.step_time_s for c in returned(result)]
    assert times == sorted(times)
    assert len({c.layout_key for c in returned(result)}) == len(times)  # runners-up are different layouts


def test_the_result_does_not_depend_on_the_number_of_workers():
    spec, cluster = get_model_spec("qwen3-235b-a22b"), get_cluster("h100", 64)
    template = ParallelConfig(seq=4096, gbs=256)
    one = search(spec, cluster, template, SearchSpace.parse("mbs=1"), runners_up=1, workers=1)
    two = search(spec, cluster, template, SearchSpace.parse("mbs=1"), runners_up=1, workers=2)
    assert one.best.plan == two.best.plan and one.best.step_time_s == two.best.step_time_s


def test_when_nothing_fits_the_closest_plan_and_its_shortfall_are_reported():
    result = plan_parallel("gpt-1t", "a100", 8, seq=2048, gbs=8, baseline=None)
    assert result.best is None and result.nearest is not None
    memory = result.nearest.prediction.memory_gib
    assert memory["total"] > memory["capacity"]
    summary = result.to_dict()["nearest"]
    assert summary["missing_gib"] == pytest.approx(memory["total"] - memory["capacity"])
    assert {"weights", "gradients", "optimizer_states", "activations", "transient"} <= set(summary["memory_gib"])


def test_a_faster_plan_that_does_not_fit_is_shown_losing_on_memory():
    result = plan_parallel(
        "qwen3-235b-a22b", "h100", 64, seq=4096, gbs=256, baseline=None, space=SearchSpace.parse("mbs=1")
    )
    assert result.best is not None
    for loser in result.too_big:
        assert loser.reason.startswith("does not fit:") and loser.at_least_s < result.best.prediction.step_time_s


def test_runners_up_say_why_they_lose():
    result = plan_parallel("gpt-175b", "a100", 64, seq=2048, gbs=64, top=3, baseline=None)
    assert len(result.runners_up) == 3
    for runner in result.runners_up:
        slower = runner.plan.prediction.step_time_s - result.best.prediction.step_time_s
        assert slower >= 0
        # a tie (e.g. cp=2 with two sequences per micro-batch prices exactly like cp=1 with one) says so
        assert ("s/step" in runner.reason) if slower > 1e-9 else runner.reason.startswith("as fast as the winner")


def test_planning_with_no_valid_layout_explains_the_divisibility():
    from trex.errors import TrexError

    with pytest.raises(TrexError, match="divisibility rules on 8 devices"):
        plan_parallel("gpt-22b", "a100", 8, seq=2048, gbs=3, baseline=None, space=SearchSpace.parse("tp=1,pp=1"))


@pytest.mark.slow
def test_deepseek_v4_pro_on_1024_cloudmatrix_dies_beats_the_public_recipe():
    result = plan_parallel("deepseek-v4-pro", "cloudmatrix384", 1024, seq=4096, gbs=1024)
    assert result.baseline.feasible and result.speedup > 1.0
    assert result.best.prediction.memory_per_device_gib <= result.best.prediction.memory_gib["capacity"]
