"""Plans: parsing, and constraints reported with their numbers."""

import pytest

from trex.cost_model.model_spec import get_model_spec
from trex.cost_model.parallel import ParallelConfig, RankLayout, parse_plan, validate
from trex.errors import TrexError

QWEN = get_model_spec("qwen3-235b-a22b")


def test_plan_string_parses_every_degree_and_derives_dp():
    plan = parse_plan("tp=2,pp=8,vpp=4,ep=32,etp=1,cp=1,zero=1", seq=4096, gbs=2048).with_devices(256)
    assert (plan.tp, plan.pp, plan.vpp, plan.ep, plan.dp, plan.zero, plan.edp, plan.microbatches) == (
        2,
        8,
        4,
        32,
        16,
        1,
        1,
        128,
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("tp=8,xp=2", "plan: unknown key 'xp'"),
        ("tp=eight", "not an integer"),
        ("tp=0", "must be a positive integer"),
        ("tp 8", "not key=value"),
    ],
)
def test_malformed_plans_are_rejected(text, message):
    with pytest.raises(TrexError, match=message):
        parse_plan(text)


@pytest.mark.parametrize(
    "plan, devices, message",
    [
        (ParallelConfig(tp=8, pp=8, dp=2), 64, r"tp\*pp\*cp\*dp = 8\*8\*1\*2 = 128 differs from the 64 devices"),
        (ParallelConfig(tp=2, pp=8, ep=7, gbs=2048, seq=4096), 256, "ep=7 does not divide the 128 experts"),
        (
            ParallelConfig(tp=2, pp=8, ep=64, gbs=2048, seq=4096),
            256,
            r"ep\*etp = 64\*1 = 64 does not divide the tp\*cp\*dp = 32",
        ),
        (ParallelConfig(tp=3, pp=1, gbs=60), 3, "tp=3 does not divide the 64 attention heads"),
        (ParallelConfig(tp=2, pp=8, gbs=100, seq=4096), 256, r"gbs=100 is not a multiple of mbs\*dp = 1\*16"),
        (
            ParallelConfig(tp=2, pp=8, vpp=4, gbs=16 * 12, seq=4096),
            256,
            "12 micro-batches per step to be a multiple of pp=8",
        ),
        (ParallelConfig(tp=2, pp=8, gbs=2048, seq=4096, recompute="selective:attn"), 256, "unknown recompute module"),
        (ParallelConfig(tp=2, pp=16, vpp=8, gbs=2048, seq=4096), 512, "exceed the 94 layers"),
        # software settings outside their sets are named, never priced as a default
        (
            ParallelConfig(tp=2, pp=8, gbs=2048, seq=4096, dispatcher="DeepEP"),
            256,
            "dispatcher='DeepEP': use one of alltoall, deepep",
        ),
        (
            ParallelConfig(tp=2, pp=8, gbs=2048, seq=4096, attention_kernel="sdpa"),
            256,
            "attention_kernel='sdpa': use one of flash, unfused",
        ),
        (
            ParallelConfig(tp=2, pp=8, gbs=2048, seq=4096, grad_dtype="fp9"),
            256,
            "grad_dtype='fp9': use one of bf16, fp16, fp8, fp32",
        ),
        (
            ParallelConfig(tp=2, pp=8, gbs=2048, seq=4096, optimizer="sgd"),
            256,
            "optimizer='sgd': use one of auto, adamw, muon",
        ),
    ],
)
def test_violations_name_the_constraint_and_the_numbers(plan, devices, message):
    problems = validate(plan, QWEN, devices)
    assert any(__import__("re").search(message, p) for p in problems), problems


def test_a_consistent_plan_has_no_violations():
    assert validate(ParallelConfig(tp=2, pp=8, vpp=4, ep=32, gbs=2048, seq=4096), QWEN, 256) == []


def test_recompute_policies():
    assert ParallelConfig(recompute="none").recompute_modules == frozenset()
    assert ParallelConfig(recompute="selective").recompute_modules == {"core_attn"}
    assert ParallelConfig(recompute="selective:layernorm+moe_act").recompute_modules == {"layernorm", "moe_act"}
    assert "moe" in ParallelConfig(recompute="full").recompute_modules


def test_rank_layout_follows_megatron_order():
    layout = RankLayout.of(ParallelConfig(tp=2, pp=8, ep=32, dp=16))
    assert layout.ranks("tp") == (0, 1)
    assert layout.ranks("dp")[:3] == (0, 2, 4)
    assert layout.ranks("pp")[:3] == (0, 32, 64)
    assert layout.ranks("ep") == tuple(range(32))


def test_plans_round_trip_through_dicts():
    plan = ParallelConfig(tp=4, pp=2, layers_per_chunk=(40, 54), dispatcher="deepep")
    assert ParallelConfig.from_dict(plan.to_dict()) == plan
    with pytest.raises(TrexError, match="unknown plan field"):
        ParallelConfig.from_dict({"tp": 2, "tensor": 4})


@pytest.mark.parametrize(
    "plan, message",
    [
        (ParallelConfig(tp=0), "tp=0 must be a positive integer"),
        (ParallelConfig(seq=-5), "seq=-5 must be a positive integer"),
        (ParallelConfig(gbs=0), "gbs=0 must be a positive integer"),
    ],
)
def test_sizes_must_be_positive_and_are_checked_before_any_division(plan, message):
    assert message in validate(plan, QWEN, 256)
