"""Which plans the distributed runtime executes, checked before any process starts.

A plan string (`"tp=2,ep=2,zero=1"`) is parsed by the cost model's `parse_plan` into its
`ParallelConfig`, completed with the world size (dp = nproc / (tp*pp*cp)), then checked twice:
against the cost model's constraints for this model (`validate`: tp divides the heads, ep the
experts, the batch divides into micro-batches, ...) and against what this runtime implements today.
Every problem is reported at once, with its numbers, so a user fixes a plan in one round.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trex.cost_model.parallel import ParallelConfig, parse_plan, validate
from trex.errors import TrexError

# Model families (transformers `model_type`) whose attention and MLP this runtime shards with tensor parallelism.
TENSOR_PARALLEL_FAMILIES = ("qwen3_moe", "deepseek_v3", "deepseek_v4")
# Families whose attention is split by heads with explicit functional collectives (runtime.tensor_parallel_heads).
HEAD_PARALLEL_FAMILIES = ("deepseek_v3", "deepseek_v4")
SUPPORTED_SUMMARY = (
    "dp (zero=0,1,2,3), ep (expert parallelism over the tp*dp ranks, etp=1), "
    f"tp with sequence parallelism (model families: {', '.join(TENSOR_PARALLEL_FAMILIES)}), "
    "pp with vpp (with dp zero=0,1,2 and ep)"
)


class PlanRefused(TrexError):
    """A plan that cannot run on this model and process count; `problems` lists each with its numbers."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("plan refused: " + "; ".join(problems))


def runtime_limits(plan: ParallelConfig, model_type: str, *, vocab_size: int = 0, tied: bool = False) -> list[str]:
    """What the plan asks for that this runtime does not execute yet (empty when it runs). `vocab_size` and
    `tied` (tie_word_embeddings) describe the model's embedding, which tensor parallelism splits by rows."""
    problems = []
    if plan.pp > 1:
        from trex.runtime.pipeline.limits import pipeline_limits

        problems += pipeline_limits(plan)
    if plan.cp > 1:
        problems.append(
            f"cp={plan.cp}: context parallelism is not executed by the runtime yet; use cp=1 (supported: "
            f"{SUPPORTED_SUMMARY})"
        )
    if plan.etp > 1:
        problems.append(
            f"etp={plan.etp}: expert tensor parallelism is not executed by the runtime yet; use etp=1 "
            f"(supported: {SUPPORTED_SUMMARY})"
        )
    if plan.tp > 1 and model_type not in TENSOR_PARALLEL_FAMILIES:
        problems.append(
            f"tp={plan.tp}: tensor parallelism is implemented for {', '.join(TENSOR_PARALLEL_FAMILIES)} only; "
            f"run {model_type} with tp=1 - use ep and dp for it"
        )
    if plan.tp > 1 and vocab_size and vocab_size % plan.tp:
        problems.append(
            f"tp={plan.tp} does not divide the vocabulary of {vocab_size} rows (the embedding and the head are split "
            f"by vocabulary rows); use a tp that divides {vocab_size}"
        )
    if plan.tp > 1 and tied:
        problems.append(
            f"tp={plan.tp}: {model_type} ties its embedding and LM head (tie_word_embeddings), which tensor "
            "parallelism splits differently (rows of the lookup, columns of the logits); run it with tp=1"
        )
    if plan.tp > 1 and plan.seq % plan.tp:
        problems.append(
            f"tp={plan.tp} with sequence parallelism splits the {plan.seq} tokens of --seq; use a --seq divisible "
            f"by {plan.tp}"
        )
    return problems


def resolve_plan(text: str, config: Any, nproc: int, **training: Any) -> ParallelConfig:
    """Parse `text`, fill dp from `nproc`, and refuse (PlanRefused) anything that cannot run.

    `training` carries seq, gbs, mbs and precision into the `ParallelConfig`. `config` is the
    model's transformers config.
    """
    from trex.cost_model.model_spec import spec_from_config

    if nproc < 1:
        raise PlanRefused([f"--nproc={nproc} must be a positive integer"])
    split = None
    if text.strip() == "auto" or text.strip().startswith("auto:"):
        text, split = planned_layout(config, nproc, **training, fix=text.strip()[len("auto:") :])
    if text.endswith(".json") or Path(text).is_file():
        text, split = _degrees_of_plan_file(Path(text), config, nproc)
    plan = parse_plan(text, **training)
    if split is not None:  # the planner's stage split travels with its degrees
        plan = dataclasses.replace(plan, layers_per_chunk=split)
    if "recompute" in text:
        raise PlanRefused(
            [
                f"{text!r}: activation recompute is not executed by the runtime (it keeps every activation); drop "
                "recompute= from the plan"
            ]
        )
    # What the runtime executes: no recompute (the prediction then keeps every activation, as the run does);
    # ZeRO-0/1/2 (runtime.data_parallel) reduce gradients with blocking calls after (ZeRO-2: during) the backward
    # and gather the updated weights after the step, hiding neither under compute. FSDP2 (ZeRO-3) prefetches.
    overlap = plan.zero >= 3
    plan = dataclasses.replace(
        plan,
        sequence_parallel=plan.tp > 1,
        recompute="none",
        overlap_grad_reduce=overlap,
        overlap_param_gather=overlap,
    )
    from trex.runtime.training_layout import runtime_layout

    plan = runtime_layout(plan)  # fp32 parameters, gradients and states; bf16 compute under autocast
    per_replica = plan.tp * plan.pp * plan.cp
    if plan.dp is None:
        if nproc % per_replica:
            raise PlanRefused(
                [f"tp*pp*cp = {plan.tp}*{plan.pp}*{plan.cp} = {per_replica} does not divide --nproc={nproc}"]
            )
        plan = dataclasses.replace(plan, dp=nproc // per_replica)
    spec = spec_from_config(config, getattr(config, "model_type", "model"))
    problems = validate(plan, spec, nproc)
    limits = runtime_limits(
        plan,
        getattr(config, "model_type", ""),
        vocab_size=getattr(config, "vocab_size", 0) or 0,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
    )
    problems += [p for p in limits if p not in problems]
    if plan.tp > 1 and getattr(config, "model_type", "") in HEAD_PARALLEL_FAMILIES:
        from trex.runtime.tensor_parallel_heads import check_divisible

        problems += [
            p
            for p in check_divisible(config, plan.tp)
            if "attention heads" not in p or not any("heads" in q for q in problems)
        ]
    if plan.ep > 1 and plan.edp < 1:
        problems.append(f"ep={plan.ep} exceeds the {plan.stage_ranks} data-parallel ranks")
    if problems:
        raise PlanRefused(problems)
    return plan


def planned_degrees(config: Any, nproc: int, *, seq: int, gbs: int, mbs: int = 1, precision: str = "fp32") -> str:
    """`--plan auto` as a plan string (degrees only; see `planned_layout`)."""
    return planned_layout(config, nproc, seq=seq, gbs=gbs, mbs=mbs, precision=precision)[0]


def planned_layout(
    config: Any, nproc: int, *, seq: int, gbs: int, mbs: int = 1, precision: str = "fp32", fix: str = ""
) -> tuple[str, tuple[int, ...] | None]:
    """`--plan auto`: the planner's fastest plan for `nproc` devices of the machine this runs on (the
    calibrated `cpu` cluster on CPU), among the layouts this runtime executes (cp, etp = 1; tp only for
    the families it shards; pp and vpp for the families the pipeline runtime cuts), as a plan string and
    the planner's stage split (layers per chunk; None without pp). The first of the best and its
    runners-up that the runtime accepts is taken, so the answer always runs. `fix` (`--plan "auto:pp=2"`)
    narrows the search as `trex plan --fix` does."""
    import sys

    import torch

    from trex.cost_model.catalog import get_cluster
    from trex.cost_model.model_spec import spec_from_config
    from trex.errors import TrexError
    from trex.planner import SearchSpace, plan_parallel
    from trex.runtime.pipeline.limits import check_pipeline_job
    from trex.runtime.pipeline.stages import PIPELINE_FAMILIES

    model_type = getattr(config, "model_type", "")
    pipelined = model_type in PIPELINE_FAMILIES and not getattr(config, "tie_word_embeddings", False)
    fixed = f"cp=1,etp=1,recompute=none,mbs={mbs}" + ("" if pipelined else ",pp=1,vpp=1")
    fixed += "" if model_type in TENSOR_PARALLEL_FAMILIES else ",tp=1"
    fixed += f",{fix}" if fix else ""
    cluster = "h100" if torch.cuda.is_available() else "cpu"
    spec = spec_from_config(config, model_type or "model")
    result = plan_parallel(
        spec, get_cluster(cluster, nproc), seq=seq, gbs=gbs, precision=precision, space=SearchSpace.parse(fixed), top=8,
        baseline=None,
    )  # fmt: skip
    candidates = ([result.best] if result.best is not None else []) + [r.plan for r in result.runners_up]
    for candidate in candidates:
        p = candidate.parallel
        text = ",".join(f"{key}={getattr(p, key)}" for key in ("tp", "pp", "vpp", "ep", "dp", "zero"))
        split = tuple(p.layers_per_chunk) if p.pp > 1 and p.layers_per_chunk else None
        plan = dataclasses.replace(
            parse_plan(text, seq=seq, gbs=gbs, mbs=mbs, precision=precision),
            sequence_parallel=p.tp > 1,
            layers_per_chunk=split,
        )
        embedding = {
            "vocab_size": getattr(config, "vocab_size", 0) or 0,
            "tied": bool(getattr(config, "tie_word_embeddings", False)),
        }
        if runtime_limits(plan, model_type, **embedding) or validate(plan, spec, nproc):
            continue
        if plan.pp > 1:
            try:  # the default schedule (1F1B, interleaved with vpp > 1) must run the planner's split
                check_pipeline_job(config, plan)
            except TrexError:
                continue
        print(
            f"trex train: --plan auto chose {text}{f' with layers per chunk {split}' if split else ''} (predicted "
            f"{candidate.prediction.step_time_s:.3g} s per step on {nproc} x {cluster})",
            file=sys.stderr,
        )
        return text, split
    raise PlanRefused([f"--plan auto: no plan the runtime executes fits {nproc} device(s) ({fixed}); give --plan"])


def _degrees_of_plan_file(path: Path, config: Any, nproc: int) -> tuple[str, tuple[int, ...] | None]:
    """A planner's `Plan` file (`trex plan --out`) as a plan string of its degrees and its stage split
    (layers per pipeline chunk, None when the plan leaves it to the default); the training shape (seq,
    batch, precision) still comes from the command line."""
    from trex.cost_model.model_spec import spec_from_config
    from trex.plan import ModelShape, Plan

    plan = Plan.load(path)
    problems = plan.model.mismatches(ModelShape.of(spec_from_config(config, getattr(config, "model_type", "model"))))
    if plan.devices != nproc:
        problems.append(f"{path} was made for {plan.devices} devices; --nproc={nproc}")
    if problems:
        raise PlanRefused([f"{path}: {p}" for p in problems])
    p = plan.parallel
    degrees = ",".join(f"{key}={getattr(p, key)}" for key in ("tp", "pp", "vpp", "ep", "etp", "cp", "dp", "zero"))
    return degrees, (tuple(p.layers_per_chunk) if p.layers_per_chunk and p.pp > 1 else None)
