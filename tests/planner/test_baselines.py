"""Baseline recipes: public layouts with sources, turned into plans for the run being planned."""

from __future__ import annotations

import pytest

from trex.cost_model import ParallelConfig, estimate_step, get_cluster, get_model_spec
from trex.cost_model.validation import plan_of_row, published_runs, published_setups
from trex.errors import TrexError
from trex.planner.baselines import baseline_plan, default_recipe, get_recipe, layers_per_chunk_from_layout, recipes


def test_every_recipe_names_a_source_and_its_models_exist():
    for recipe in recipes().values():
        assert recipe.source and recipe.description
        for model in recipe.models:
            spec = get_model_spec(model)
            devices = 4 * recipe.value("tp", model) * recipe.value("pp", model) * recipe.value("cp", model)
            plan, adjusted = baseline_plan(recipe, spec, devices, ParallelConfig(seq=4096, gbs=4 * devices))
            assert adjusted == [] and plan.recompute == recipe.recompute and plan.dp == 4


def test_megatron_layouts_with_repeats_expand_to_layers_per_chunk():
    assert layers_per_chunk_from_layout("Et*4|(tttt|)*14tmL", 16, 61) == (4,) * 15 + (1,)
    assert layers_per_chunk_from_layout("Et|(tt|)*30mL", 32, 61) == (1,) + (2,) * 30 + (0,)
    with pytest.raises(TrexError, match="places 60 layers, the model has 61"):
        layers_per_chunk_from_layout("Et*4|(tttt|)*14mL", 16, 61)


def test_the_korthikanti_recipe_is_the_published_configuration():
    setups = published_setups()
    for row in published_runs():
        if row["model"].startswith("gpt-"):
            spec = get_model_spec(row["model"])
            published = plan_of_row(row, setups.get(row["id"], {}), spec.num_layers)
            plan, _ = baseline_plan(default_recipe(spec), spec, int(row["devices"]), published)
            for field in ("tp", "pp", "vpp", "ep", "cp", "zero", "mbs"):
                assert getattr(plan, field) == getattr(published, field), (row["id"], field)


def test_a_model_without_a_public_layout_gets_the_scaled_stand_in_and_says_what_changed():
    spec = get_model_spec("pangu-ultra-135b")
    recipe = get_recipe("stand-in-megatron-dsv3")
    plan, adjusted = baseline_plan(recipe, spec, 64, ParallelConfig(seq=4096, gbs=64))
    assert plan.ep == 1 and any("dense model" in a for a in adjusted)
    assert estimate_step(spec, get_cluster("ascend-910b", 64), plan).step_time_s > 0


def test_recipes_of_published_runs_report_the_software_their_run_used():
    from dataclasses import replace

    from trex.cost_model.validation import compare_all, extra_published_runs
    from trex.planner.baselines import published_software, software_differences

    rows = {row["id"] for row in (*published_runs(), *extra_published_runs())}
    for recipe in recipes().values():
        linked = (
            recipe.published_row.values()
            if isinstance(recipe.published_row, dict)
            else [recipe.published_row]
            if recipe.published_row
            else []
        )
        assert set(linked) <= rows, recipe.name
    qwen = get_recipe("megatron-moe-modelzoo-qwen3")
    spec = get_model_spec("qwen3-235b-a22b")
    assert published_software(qwen, spec.name)["dispatcher"] == "deepep"
    template = ParallelConfig(seq=4096, gbs=2048)
    plan, _ = baseline_plan(qwen, spec, 256, template)
    (difference,) = software_differences(qwen, spec.name, plan)
    assert "dispatcher=deepep" in difference and "--set dispatcher=deepep" in difference
    # priced with the published software, the baseline is the validation's estimate of row Q3-A
    plan, _ = baseline_plan(qwen, spec, 256, replace(template, dispatcher="deepep"))
    assert software_differences(qwen, spec.name, plan) == []
    validated = {c.id: c for c in compare_all()}["Q3-A"].estimate
    assert estimate_step(spec, get_cluster("h100", 256), plan).step_time_s == pytest.approx(validated.step_time_s)
    # a recipe may name a further published row: the Llama 3 70B FP8 recipe ran with TP overlap and BF16 gradients
    llama = get_recipe("megatron-bridge-llama3-70b-h100-fp8")
    assert published_software(llama, "llama3-70b") == {
        "fp8_recipe": "tensorwise",
        "overlap_p2p": True,
        "tp_comm_overlap": True,
        "grad_dtype": "bf16",
    }
    # how FP8 is scaled is named only for plans that run FP8
    llama_spec = get_model_spec("llama3-70b")
    for precision, named in (("bf16", False), ("fp8", True)):
        plan, _ = baseline_plan(llama, llama_spec, 64, ParallelConfig(seq=8192, gbs=128, precision=precision))
        differences = software_differences(llama, "llama3-70b", plan)
        assert any("fp8_recipe=tensorwise" in d and "--set fp8_recipe=tensorwise" in d for d in differences) == named, (
            differences
        )


def test_the_recipe_written_for_the_planned_precision_is_tried_first():
    from trex.planner.baselines import recipes_for

    spec = get_model_spec("llama3-70b")
    assert [r.name for r in recipes_for(spec, "bf16")][0] == "megatron-bridge-llama3-70b-h100-bf16"
    assert [r.name for r in recipes_for(spec, "fp8")][0] == "megatron-bridge-llama3-70b-h100-fp8"
    assert [r.name for r in recipes_for(spec)] == [
        "megatron-bridge-llama3-70b-h100-bf16",
        "megatron-bridge-llama3-70b-h100-fp8",
    ]
    # models with one recipe keep it whatever the precision
    assert [r.name for r in recipes_for(get_model_spec("deepseek-v3"), "fp8")] == ["megatron-bridge-dsv3-h100"]
    qwen = get_model_spec("qwen3-235b-a22b")
    assert [r.name for r in recipes_for(qwen, "fp8")] == [
        "megatron-bridge-qwen3-235b-h100-fp8",
        "megatron-moe-modelzoo-qwen3",
    ]
    assert [r.name for r in recipes_for(qwen, "bf16")] == [
        "megatron-moe-modelzoo-qwen3",
        "megatron-bridge-qwen3-235b-h100-fp8",
    ]
