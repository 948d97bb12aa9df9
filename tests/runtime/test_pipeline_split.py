"""The stage split and the chunk modules (one process): bad splits are refused with their numbers,
chunks chained in model order compute the whole model's logits exactly, and the ranks' parts keep the
unsharded model's parameter names, each exactly once."""

from __future__ import annotations

import copy

import pytest
import torch

from trex.cost_model.parallel import parse_plan
from trex.errors import TrexError
from trex.models import build_model, tiny_config
from trex.runtime.pipeline.split import from_counts, from_ranges, split_for_plan
from trex.runtime.pipeline.stages import build_chunks, check_pipeline_model, keep_rank_part
from trex.runtime.trainer import TrainJob

SHAPE = {"seq": 16, "gbs": 4, "mbs": 1}


def plan(text: str, **shape):
    return parse_plan(text, **{**SHAPE, **shape})


@pytest.mark.parametrize("family", ["qwen3-moe", "deepseek-v3", "deepseek-v4"])
def test_chunks_in_model_order_compute_the_whole_models_logits_and_keep_its_names(family):
    config = tiny_config(family)
    model = build_model(config, seed=0)
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    want = model(input_ids=ids, use_cache=False).logits
    names = {name for name, _ in model.named_parameters()}
    for text, placement in [("pp=2", "loop"), ("pp=4", "loop"), ("pp=2,vpp=2", "loop"), ("pp=2,vpp=2", "v")]:
        p = plan(text)
        split = split_for_plan(p, config.num_hidden_layers, placement)
        check_pipeline_model(config, split)
        chunks, kept = {}, []
        for rank in range(p.pp):
            part = keep_rank_part(copy.deepcopy(model), split, rank)
            kept += [name for name, _ in part.named_parameters()]
            chunks.update({c.chunk.index: c for c in build_chunks(part, split, rank)})
        x = ids
        for index in range(len(split.chunks)):
            x = chunks[index](x)
        assert torch.equal(x, want), f"{family} {text} {placement}"
        assert sorted(kept) == sorted(names), f"{family} {text}: every parameter on exactly one rank, same name"


def test_v_placement_puts_the_first_and_last_chunk_on_rank_0():
    split = split_for_plan(plan("pp=2,vpp=2"), 4, "v")
    assert [c.rank for c in split.chunks] == [0, 1, 1, 0]
    assert split.chunks_of(0)[0].first and split.chunks_of(0)[1].last


def test_split_that_does_not_cover_every_layer_exactly_once_is_refused_with_the_numbers():
    with pytest.raises(TrexError, match=r"places 3 layers \(1\+2\); the model has 4"):
        from_counts((1, 2), 4, 2, 1)
    with pytest.raises(TrexError, match="layer 1 is placed twice"):
        from_ranges("0-1,1-3", 4, 2, 1)
    with pytest.raises(TrexError, match="layer\\(s\\) 2 are in no chunk"):
        from_ranges("0-1,3-3", 4, 2, 1)
    with pytest.raises(TrexError, match="3 chunks given; pp\\*vpp = 2\\*1 = 2"):
        from_ranges("0,1-2,3", 4, 2, 1)
    with pytest.raises(TrexError, match="layer\\(s\\) 4 do not exist"):
        from_ranges("0-1,2-4", 4, 2, 1)


def test_more_stages_than_layers_and_vpp_not_dividing_the_layers_are_refused():
    with pytest.raises(TrexError, match="pp\\*vpp = 4\\*2 = 8 pipeline chunks exceed the model's 4 decoder layers"):
        split_for_plan(plan("pp=4,vpp=2"), 4)
    with pytest.raises(TrexError, match="vpp=3 does not divide the model's 4 decoder layers"):
        split_for_plan(plan("pp=1,vpp=3"), 4)


def test_deepseek_v4_hash_routed_layers_must_be_in_the_first_chunk():
    config = tiny_config("deepseek-v4", num_layers=6)
    config.mlp_layer_types = ["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"]
    check_pipeline_model(config, from_ranges("0-1,2-5", 6, 2, 1))  # accepted
    with pytest.raises(TrexError, match="layer\\(s\\) 1 are hash-routed MoE layers .* at least 2 layers"):
        check_pipeline_model(config, from_ranges("0,1-5", 6, 2, 1))


def test_bad_pipeline_jobs_are_refused_before_any_process_starts():
    def refused(text, nproc, **fields):
        with pytest.raises(TrexError) as error:
            TrainJob.create("tiny-qwen3-moe", text, nproc, **{**SHAPE, **fields.pop("shape", {})}, steps=1, **fields)
        return str(error.value)

    assert "pp*vpp = 8*1 = 8 chunks exceed the 4 layers" in refused("pp=8", 8)  # the cost model's own check
    assert "pp*vpp = 6*1 = 6 pipeline chunks exceed the model's 4 decoder layers" in refused("pp=6", 6)
    assert "runs one chunk per stage; the plan has vpp=2" in refused("pp=2,vpp=2", 2, schedule="1f1b")
    assert "runs exactly 2 chunks per stage" in refused("pp=2", 2, schedule="zbv")
    assert "unknown --schedule 'pipedream'" in refused("pp=2", 2, schedule="pipedream")
    assert "needs at least as many micro-batches as chunks (2*pp = 4); there are 2" in refused(
        "pp=2,vpp=2", 2, schedule="dualpipev", shape={"gbs": 2}
    )
    assert "layer 1 is placed twice" in refused("pp=2", 2, stage_split="0-1,1-3")
    assert "--schedule applies to pipeline parallelism; the plan has pp=1" in refused("", 1, schedule="gpipe")
    assert "the split backward loses the weight gradients of the routed experts" in refused(
        "pp=2,vpp=2,dp=2,ep=2,zero=3", 4, schedule="zbv"
    )
    assert "drop --compile or use gpipe, 1f1b or interleaved" in refused("pp=2,vpp=2", 2, schedule="zbv", compile=True)
    # pp x tp: sequence-parallel tp inside the stages (Qwen3-MoE; V3/V4 head-parallel), under every schedule
    for model in ("tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-deepseek-v4"):
        for schedule in ("interleaved", "zbv", "dualpipev"):
            created = TrainJob.create(model, "pp=2,vpp=2,tp=2", 4, **SHAPE, steps=1, schedule=schedule)
            assert (created.parallel.tp, created.parallel.vpp) == (2, 2)
    for model in ("tiny-deepseek-v3", "tiny-deepseek-v4"):
        assert TrainJob.create(model, "pp=2,tp=2", 4, **SHAPE, steps=1, schedule="gpipe").parallel.tp == 2
        # with ep over the tp ranks (run: test_head_parallel_stages_compose_with_expert_parallelism_on_four_ranks)
        created = TrainJob.create(model, "pp=2,vpp=2,tp=2,ep=2", 4, **SHAPE, steps=1, schedule="zbv").parallel
        assert (created.tp, created.ep) == (2, 2)
        # V3/V4's head-parallel stages have been run with pp x tp and pp x tp x ep: what was not run is refused
        for plan, nproc, fields, named in (
            ("pp=2,tp=2,dp=2", 8, {}, "drop dp=2"),
            ("pp=2,tp=2,zero=3", 4, {}, "drop zero=3"),
            ("pp=2,tp=2", 4, {"compile": True}, "drop --compile"),
        ):
            with pytest.raises(TrexError, match=f"head-parallel attention inside each stage.*{named}"):
                TrainJob.create(model, plan, nproc, **SHAPE, steps=1, **fields)


def test_trex_train_refuses_a_bad_stage_split_before_starting_ranks(capsys):
    from trex.cli import main

    code = main(["train", "--model", "tiny-deepseek-v4", "--plan", "pp=2", "--nproc", "2", "--stage-split", "0-1,3"])
    err = capsys.readouterr().err
    assert code != 0 and "layer(s) 2 are in no chunk" in err


def test_a_planner_plan_file_brings_its_stage_split(tmp_path):
    """The planner's non-uniform split (layers_per_chunk of a `trex plan --out` file) is the split that runs."""
    from trex.cost_model.model_spec import spec_from_config
    from trex.cost_model.parallel import ParallelConfig
    from trex.plan import ModelShape, Plan
    from trex.runtime.run_plan import resolve_plan

    config = tiny_config("deepseek-v4")
    shape = ModelShape.of(spec_from_config(config, "tiny-deepseek-v4"))
    parallel = ParallelConfig(pp=2, dp=1, zero=1, seq=16, gbs=4, layers_per_chunk=(1, 3))
    path = Plan(shape, "cpu", 2, "cpu", parallel).save(tmp_path / "plan.json")
    resolved = resolve_plan(str(path), config, 2, **SHAPE)
    assert resolved.layers_per_chunk == (1, 3)
    split = split_for_plan(resolved, config.num_hidden_layers)
    assert [(c.start, c.end, c.rank) for c in split.chunks] == [(0, 1, 0), (1, 4, 1)]
    check_pipeline_model(config, split)  # V4's hash-routed layer 0 sits in chunk 0


def test_end_chunks_may_hold_only_the_embedding_or_the_head():
    """The planner's account-for-embedding/loss split (4 layers over pp=2 x vpp=3: 0,1,1,1,1,0) runs; an empty
    chunk in the middle is refused."""
    split = from_counts((0, 1, 1, 1, 1, 0), 4, 2, 3)
    assert split.chunks[0].first and split.chunks[0].end == split.chunks[0].start
    assert split.chunks[-1].last and split.layers_per_chunk[-1] == 0
    with pytest.raises(TrexError, match=r"chunk\(s\) 2 hold 0 layers; every chunk but the first and the last"):
        from_counts((1, 1, 0, 1, 1, 0), 4, 2, 3)
