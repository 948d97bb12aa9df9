"""The search space: every enumerated candidate is a plan the cost model accepts; the rules are data."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trex.cost_model import ParallelConfig, get_cluster, get_model_spec, validate
from trex.errors import TrexError
from trex.planner.space import SearchSpace, layer_choices, pipeline_options, recompute_options, zero_options
from trex.planner.topology import placement_problems

MODELS = ["gpt-22b", "qwen3-235b-a22b", "deepseek-v3", "deepseek-v4-flash"]


@given(
    st.sampled_from(MODELS),
    st.sampled_from([("h100", 64), ("a100", 32), ("cloudmatrix384", 256), ("ascend-910b", 64)]),
    st.sampled_from([2048, 4096]),
    st.sampled_from([64, 96, 256]),
)
def test_every_enumerated_candidate_satisfies_every_constraint(name, target, seq, gbs):
    spec = get_model_spec(name)
    cluster = get_cluster(*target)
    template = ParallelConfig(seq=seq, gbs=gbs)
    space = SearchSpace()
    for choice in layer_choices(spec, cluster, template, space):
        assert placement_problems(cluster, choice.tp, choice.ep, choice.etp) == []
        for option in pipeline_options(spec, cluster, template, space, choice):
            for zero in zero_options(space, choice, option):
                plan = dataclasses.replace(
                    template,
                    tp=choice.tp,
                    cp=choice.cp,
                    ep=choice.ep,
                    etp=choice.etp,
                    mbs=choice.mbs,
                    pp=option.pp,
                    vpp=option.vpp,
                    dp=option.dp,
                    zero=zero,
                )
                assert validate(plan, spec, cluster.devices) == []


def test_recompute_policies_with_the_same_effect_on_a_model_are_tried_once():
    gpt = recompute_options(get_model_spec("gpt-22b"), SearchSpace(), ParallelConfig())
    # GPT has no MLA or MoE: those modules drop nothing, so policies collapse and are named by what they drop
    assert gpt == [
        "none",
        "selective:core_attn",
        "selective:layernorm",
        "selective:mlp",
        "selective:layernorm+mlp",
        "full",
    ]
    v4 = recompute_options(get_model_spec("deepseek-v4-pro"), SearchSpace(), ParallelConfig())
    assert "selective:mla_up_proj" in v4 and "selective:moe_act+moe" in v4 and len(v4) == len(set(v4))


def test_the_template_recompute_policy_is_always_tried():
    options = recompute_options(
        get_model_spec("deepseek-v3"), SearchSpace(), ParallelConfig(recompute="selective:mlp+layernorm+mla_up_proj")
    )
    assert "selective:mla_up_proj+layernorm+mlp" in options


def test_fixing_dimensions_narrows_the_space():
    space = SearchSpace.parse("tp=1,ep=32/64,recompute=full")
    assert space.tp == (1,) and space.ep == (32, 64) and space.recompute == ("full",)
    spec, cluster = get_model_spec("deepseek-v4-flash"), get_cluster("cloudmatrix384", 256)
    choices = list(layer_choices(spec, cluster, ParallelConfig(seq=4096, gbs=256), space))
    assert choices and {(c.tp, c.ep) for c in choices} <= {(1, 32), (1, 64)}


def test_min_expert_rows_keeps_only_layouts_whose_experts_get_that_many_rows():
    from trex.cost_model.caveats import rows_per_local_expert

    space = SearchSpace.parse("min_expert_rows=2048")
    assert space.min_expert_rows == 2048 and space.describe() == "min_expert_rows=2048"
    spec, cluster = get_model_spec("qwen3-235b-a22b"), get_cluster("h100", 256)
    template = ParallelConfig(seq=4096, gbs=2048)
    every = list(layer_choices(spec, cluster, template, SearchSpace()))
    kept = list(layer_choices(spec, cluster, template, space))

    def rows(c):
        return rows_per_local_expert(
            spec, dataclasses.replace(template, tp=c.tp, cp=c.cp, ep=c.ep, etp=c.etp, mbs=c.mbs)
        )

    assert kept and set(kept) == {c for c in every if rows(c) >= 2048} and len(kept) < len(every)
    # a dense model has no experts to starve: the filter keeps everything
    dense, dense_cluster = get_model_spec("gpt-22b"), get_cluster("a100", 16)
    assert list(layer_choices(dense, dense_cluster, template, space)) == list(
        layer_choices(dense, dense_cluster, template, SearchSpace())
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("tp", "not key=value"),
        ("tq=2", "--fix: unknown key 'tq'"),
        ("tp=two", "must be integers"),
        ("zero=-1", ">= 0"),
        ("pp=0", "positive"),
        ("min_expert_rows=2k", "one non-negative integer"),
    ],
)
def test_bad_fix_strings_say_what_is_wrong(text, message):
    with pytest.raises(TrexError, match=message):
        SearchSpace.parse(text)


def test_by_default_tp_stays_at_most_16_and_cp_shards_keep_1024_tokens():
    spec, cluster = get_model_spec("deepseek-v4-pro"), get_cluster("cloudmatrix384", 1024)
    choices = list(layer_choices(spec, cluster, ParallelConfig(seq=4096, gbs=1024), SearchSpace()))
    assert max(c.tp for c in choices) == 16 and max(c.cp for c in choices) == 4
    assert {c.etp for c in choices if c.tp == 8} == {1, 8}  # expert TP off or equal to tp
    wider = list(layer_choices(spec, cluster, ParallelConfig(seq=4096, gbs=1024), SearchSpace.parse("tp=32,cp=8")))
    assert {(c.tp, c.cp) for c in wider} == {(32, 8)}
