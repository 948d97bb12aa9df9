"""What the pipeline runtime executes, checked before any process starts.

`pipeline_limits(plan)` lists what a pp > 1 plan asks for beyond it (joined into `run_plan`'s
refusal); `check_pipeline_job` checks the schedule, the stage split and the model together (the
schedule's micro-batch rules, the split's coverage, DeepSeek-V4's hash-routed layers on chunk 0).
"""

from __future__ import annotations

from typing import Any

from trex.cost_model.parallel import ParallelConfig


def pipeline_limits(plan: ParallelConfig) -> list[str]:
    """Nothing a pp > 1 plan asks for is refused on the plan alone: what depends on the model (tp's family,
    the split) or the schedule is `check_pipeline_job`'s."""
    return []


# tp inside pipeline stages: Qwen3-MoE's sequence-parallel DTensor styles (`runtime.tensor_parallel`) and
# DeepSeek-V3/V4's head-parallel attention (`runtime.tensor_parallel_heads`), both cut at chunk boundaries
# (`stages.ChunkModule.sequence_parallel_on`)
TP_FAMILIES = ("qwen3_moe", "deepseek_v3", "deepseek_v4")


def tensor_parallel_problems(config: Any, plan: ParallelConfig, schedule: str, compile: bool = False) -> list[str]:
    """pp x tp runs tensor parallelism with sequence parallelism inside each stage, for the families that have
    been checked against the 1-rank run under every schedule - GPipe and 1F1B, interleaved 1F1B (vpp=2) and
    the split-backward ZB-V and DualPipeV (tests/runtime/test_pipeline_parallel.py, bench/RESULTS.md 14.7 and
    14.9). DeepSeek-V3/V4's head-parallel stages have been run with pp x tp and with pp x tp x ep (the routed
    experts over the tp ranks, RESULTS 14.11): not yet composed with dp, ZeRO-3 (its chunk roots are wrapped
    before tp swaps in the vocabulary-parallel embedding) or compiled chunks, so those are refused for them."""
    if plan.tp == 1:
        return []
    problems = []
    family = getattr(config, "model_type", "")
    if family not in TP_FAMILIES:
        problems.append(
            f"pp={plan.pp} with tp={plan.tp} runs {', '.join(TP_FAMILIES)} models (sequence-parallel tp inside each "
            f"stage); {family or 'this model'} is not one of them: use tp=1 with pp or pp=1 with tp"
        )
    elif family != "qwen3_moe":
        untried = [f"dp={plan.dp}"] if plan.dp > 1 else []
        untried += ["zero=3"] if plan.zero == 3 else []
        untried += ["--compile"] if compile else []
        if untried:
            problems.append(
                f"pp={plan.pp} x tp={plan.tp} for {family} (head-parallel attention inside each stage) has been "
                f"checked against the 1-rank run without dp, zero=3 or --compile; drop {', '.join(untried)} "
                "or use tp=1 with pp"
            )
    return problems


def check_pipeline_job(
    config: Any, plan: ParallelConfig, schedule: str = "", stage_split: str = "", compile: bool = False
) -> None:
    """Raise TrexError (with the numbers) when this pp > 1 run cannot start; nothing for pp = 1 unless a
    pipeline option was given."""
    from trex.errors import TrexError
    from trex.runtime.pipeline.schedules import V_SCHEDULES, default_schedule, placement_of, schedule_problems
    from trex.runtime.pipeline.split import split_for_plan
    from trex.runtime.pipeline.stages import check_pipeline_model

    if plan.pp == 1:
        if schedule or stage_split:
            given = "--schedule" if schedule else "--stage-split"
            raise TrexError(f"{given} applies to pipeline parallelism; the plan has pp=1 (add pp=2 or more)")
        return
    name = schedule or default_schedule(plan.vpp)
    problems = schedule_problems(name, plan.pp, plan.vpp, plan.microbatches)
    if compile and name in V_SCHEDULES:
        # The V schedules run a chunk's backward as two passes (input gradients, then weight gradients);
        # a compiled chunk's backward is one fused node that computes both (torch.distributed.pipelining
        # refuses torch.compile'd stages for these schedules for the same reason).
        problems.append(
            f"--schedule {name} splits each backward into input- and weight-gradient passes, which a compiled "
            "chunk (one fused backward) cannot run; drop --compile or use gpipe, 1f1b or interleaved"
        )
    if plan.zero == 3 and plan.ep > 1 and name in V_SCHEDULES:
        # Measured (bench/RESULTS.md 14.3): with the split backward, the weight-gradient pass's gradients of the
        # modules sharded as their own FSDP2 units inside a chunk are lost (relative error 0.5-1.0 from the first
        # step): FSDP2 runs a unit's post-backward when the gradient reaches the unit's forward inputs, i.e. in
        # the input-gradient pass, before the weight pass has computed anything. With ep=1 the chunk is then the
        # only unit (`parallelize(fsdp_layers=False)`, RESULTS 14.4); under ep the routed experts must be their
        # own unit (they shard over the expert-data-parallel mesh, the chunk over dp).
        problems.append(
            f"--schedule {name} with zero=3 and ep={plan.ep}: the split backward loses the weight gradients of the "
            "routed experts, which FSDP2 must shard as their own unit over the expert-data-parallel ranks; use "
            "zero=1 or 2 with ep, ep=1 with zero=3, or gpipe, 1f1b or interleaved"
        )
    problems += tensor_parallel_problems(config, plan, name, compile)
    try:  # every problem at once: the split's and the schedule's
        split = split_for_plan(plan, config.num_hidden_layers, placement_of(name), stage_split or None)
        check_pipeline_model(config, split)
    except TrexError as error:
        problems.insert(0, str(error))
    if problems:
        raise TrexError("; ".join(problems))
