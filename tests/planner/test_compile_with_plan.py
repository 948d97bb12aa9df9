"""trex.compile(model, plan=...): a plan is checked against the model and kept (multi-process plans:
tests/runtime/test_compile_in_process_group.py)."""

from __future__ import annotations

import pytest
import torch

import trex
from trex.cost_model.model_spec import spec_from_config
from trex.errors import TrexError
from trex.models import build_model, tiny_config
from trex.planner import plan_parallel


@pytest.fixture(scope="module")
def tiny_plans():
    spec = spec_from_config(tiny_config("deepseek-v4"), "tiny-deepseek-v4")
    one = plan_parallel(spec, "cpu", 1, seq=32, gbs=2, baseline=None).best
    two = plan_parallel(spec, "cpu", 2, seq=32, gbs=2, baseline=None).best
    deeper = plan_parallel(
        spec_from_config(tiny_config("deepseek-v4", num_layers=6), "tiny-deepseek-v4-6"),
        "cpu",
        1,
        seq=32,
        gbs=2,
        baseline=None,
    ).best
    return one, two, deeper


def test_a_single_process_plan_compiles_runs_and_is_recorded(tmp_path):
    spec = spec_from_config(tiny_config("qwen3-moe"), "tiny-qwen3-moe")
    one = plan_parallel(spec, "cpu", 1, seq=32, gbs=2, baseline=None).best
    assert one.world_size == 1
    path = one.save(tmp_path / "plan.json")
    torch.manual_seed(0)
    model = build_model(tiny_config("qwen3-moe"))
    compiled = trex.compile(model, plan=path)
    ids = torch.randint(0, 128, (2, 16))
    loss = compiled(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert compiled.trex.plan == one


def test_a_plan_needing_more_processes_is_refused_with_its_world_size(tiny_plans):
    _, two, _ = tiny_plans
    with pytest.raises(TrexError, match=r"needs 2 processes .*torchrun --nproc-per-node 2.*`trex train"):
        trex.compile(build_model(tiny_config("deepseek-v4")), plan=two)


def test_a_plan_for_a_different_model_is_refused_with_the_reason(tiny_plans):
    _, _, deeper = tiny_plans
    with pytest.raises(TrexError, match="made for 6 decoder layers, the model has 4"):
        trex.compile(build_model(tiny_config("deepseek-v4")), plan=deeper)


def test_experts_not_divisible_by_the_plans_ep_are_refused(tiny_plans):
    import dataclasses

    one, _, _ = tiny_plans
    odd = dataclasses.replace(
        one, parallel=dataclasses.replace(one.parallel, ep=3), model=dataclasses.replace(one.model, num_experts=8)
    )
    with pytest.raises(TrexError, match="ep=3 does not divide the 8 experts"):
        trex.compile(build_model(tiny_config("deepseek-v4")), plan=odd)
