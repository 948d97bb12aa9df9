"""Planning end to end: search, the named baseline, and the result as `trex.plan.Plan` objects.

result = plan_parallel("deepseek-v4-pro", "cloudmatrix384", 1024, seq=4096, gbs=1024)
result.best                      # Plan: degrees, split, predicted step time / MFU / memory
result.runners_up                # [(Plan, why it loses)]
result.baseline                  # the public recipe's layout on the same run, priced the same way
result.to_dict()                 # what `trex plan --json` prints
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trex.cost_model.catalog import get_cluster
from trex.cost_model.cluster import Cluster
from trex.cost_model.model_spec import ModelSpec, get_model_spec
from trex.cost_model.parallel import InfeasiblePlan, ParallelConfig
from trex.cost_model.step import StepEstimate, estimate_step
from trex.errors import TrexError
from trex.plan import ModelShape, Plan, Prediction
from trex.planner.baselines import Recipe, baseline_plan, get_recipe, recipes_for, software_differences
from trex.planner.reasons import shortfall, why_slower, why_too_big
from trex.planner.search import Candidate, Progress, SearchResult, search
from trex.planner.space import SearchSpace

SUMMARY_FIELDS = ("tp", "pp", "vpp", "ep", "etp", "cp", "dp", "zero", "mbs", "recompute")


@dataclass
class RunnerUp:
    plan: Plan
    reason: str
    at_least_s: float | None = None  # plans never priced in full (they do not fit): their pipeline time, a lower bound


@dataclass
class Baseline:
    recipe: Recipe
    config: ParallelConfig
    adjusted: list[str]
    plan: Plan | None  # None when the recipe's layout is not a valid plan for this run
    violations: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # the model's other recipes, passed over because they do not fit
    software_differences: list[str] = field(default_factory=list)  # priced with other software than the published run

    @property
    def feasible(self) -> bool:
        return self.plan is not None and self.plan.prediction is not None and self.plan.prediction.feasible


@dataclass
class PlanningResult:
    spec: ModelSpec
    cluster: Cluster
    template: ParallelConfig
    search: SearchResult
    best: Plan | None
    runners_up: list[RunnerUp]
    too_big: list[RunnerUp]  # faster pipelines than the winner that do not fit
    nearest: Plan | None  # when nothing fits: the plan closest to fitting
    baseline: Baseline | None

    @property
    def feasible(self) -> bool:
        return self.best is not None

    @property
    def speedup(self) -> float | None:
        """Baseline step time over the best plan's (None without a feasible baseline)."""
        if self.best is None or self.baseline is None or not self.baseline.feasible:
            return None
        return self.baseline.plan.prediction.step_time_s / self.best.prediction.step_time_s

    def to_dict(self) -> dict[str, Any]:
        stats = self.search.stats
        out: dict[str, Any] = {
            "model": self.spec.name,
            "cluster": self.cluster.name,
            "devices": self.cluster.devices,
            "device": self.cluster.device.name,
            "seq": self.template.seq,
            "gbs": self.template.gbs,
            "precision": self.template.precision,
            "feasible": self.feasible,
            "best": plan_summary(self.best) if self.best else None,
            "runners_up": [{**plan_summary(r.plan), "reason": r.reason} for r in self.runners_up],
            "faster_but_too_big": [
                {**plan_summary(r.plan), "reason": r.reason, "pipeline_s_at_least": r.at_least_s} for r in self.too_big
            ],
            "baseline": baseline_summary(self.baseline) if self.baseline else None,
            "speedup_over_baseline": self.speedup,
            "search_time_s": stats.seconds,
            "candidates": stats.candidates_priced,
            "search_space": stats.space_size,
            "search": stats.to_dict(),
            "search_space_rules": self.search.space.describe(),
        }
        if self.best is not None:
            out["plan"] = self.best.to_dict()
        if self.nearest is not None:
            memory = self.nearest.prediction.memory_gib if self.nearest.prediction else {}
            out["nearest"] = {
                **plan_summary(self.nearest),
                "memory_gib": memory,
                "missing_gib": max(0.0, memory.get("total", 0.0) - memory.get("capacity", math.inf)),
            }
        return out


def plan_summary(plan: Plan) -> dict[str, Any]:
    """The fields `trex plan --json` promises for a plan."""
    p, r = plan.parallel, plan.prediction
    out: dict[str, Any] = {name: getattr(p, name) for name in SUMMARY_FIELDS}
    out["layers_per_chunk"] = list(plan.layers_per_chunk)
    if r is not None:
        out.update(
            step_time_s=r.step_time_s,
            mfu=r.mfu,
            mfu_6n=r.mfu_6n,
            tokens_per_s_per_device=r.tokens_per_s_per_device,
            memory_per_device_gib=r.memory_per_device_gib,
            memory_gib=dict(r.memory_gib),
            breakdown=dict(r.breakdown),
            feasible=r.feasible,
        )
    out["notes"] = list(plan.notes)
    return out


def baseline_summary(baseline: Baseline) -> dict[str, Any]:
    out: dict[str, Any] = {
        "recipe": baseline.recipe.name,
        "description": baseline.recipe.description,
        "source": baseline.recipe.source,
        "adjusted": baseline.adjusted,
        "skipped": baseline.skipped,
        "not_modelled": list(baseline.recipe.not_modelled),
        "software_differences": baseline.software_differences,
    }
    if baseline.plan is not None:
        out.update(plan_summary(baseline.plan))
    else:
        c = baseline.config
        out.update({name: getattr(c, name) for name in SUMMARY_FIELDS}, feasible=False)
    out["violations"] = baseline.violations
    return out


def make_plan(
    spec: ModelSpec,
    cluster: Cluster,
    config: ParallelConfig,
    estimate: StepEstimate | None,
    source: str,
    notes: tuple[str, ...] = (),
) -> Plan:
    notes = tuple(notes) + tuple(
        n for n in (estimate.notes if estimate else ()) if n not in notes
    )  # the cost model's own caveats too
    return Plan(
        ModelShape.of(spec),
        cluster.name,
        cluster.devices,
        cluster.device.name,
        config,
        Prediction.of(estimate) if estimate else None,
        source,
        notes,
    )


def _split_note(candidate: Candidate) -> str:
    split = candidate.split
    if split.optimal:
        return f"stage split: optimal ({split.method})"
    return f"stage split: best found ({split.method}); within {split.gap:.2%} of the proved lower bound"


def plan_parallel(
    model: str | Path | ModelSpec,
    cluster: str | Path | Cluster,
    devices: int | None = None,
    *,
    seq: int = 4096,
    gbs: int = 1024,
    precision: str = "bf16",
    software: dict[str, Any] | None = None,
    space: SearchSpace | None = None,
    top: int = 3,
    baseline: str | None = "auto",
    progress: Progress | None = None,
    workers: int | None = None,
    time_limit_s: float | None = None,
) -> PlanningResult:
    """Find the fastest plan for `model` on `devices` of `cluster`, and price `baseline` the same way.

    `software` sets the ParallelConfig fields the search does not choose (dispatcher, attention
    kernel, overlaps, gradient and optimizer-state dtypes...); `baseline` is a recipe name from
    `baseline_recipes.toml`, "auto" (the model's public recipe or the documented stand-in) or None.
    """
    spec = model if isinstance(model, ModelSpec) else get_model_spec(model)
    if isinstance(cluster, Cluster):
        cluster = cluster.sized(devices) if devices is not None else cluster
    else:
        cluster = get_cluster(cluster, devices)
    searched = set(SUMMARY_FIELDS) | {"layers_per_chunk"}
    software = dict(software or {})
    overlap = sorted(searched & set(software))
    if overlap:
        raise TrexError(
            f"software settings may not fix searched fields ({', '.join(overlap)}); narrow the search space instead (--fix)"
        )
    template = ParallelConfig(seq=seq, gbs=gbs, precision=precision, **software)
    result = search(
        spec, cluster, template, space, runners_up=top, progress=progress, workers=workers, time_limit_s=time_limit_s
    )
    stats = result.stats
    if stats.space_size == 0:
        raise TrexError(_empty_space(spec, cluster, template, result.space))
    best = None
    notes: list[str] = []
    if result.best is not None:
        notes.append(_split_note(result.best))
        if stats.optimality_gap > 0:
            notes.append(
                f"search: no plan in the space is more than {stats.optimality_gap:.2%} faster (unproved interleaved splits bound it)"
            )
        if not stats.exhaustive:
            notes.append("search stopped at its time limit: the space was not exhausted")
        best = make_plan(spec, cluster, result.best.plan, result.best.estimate, "trex planner", tuple(notes))
    runners = [
        RunnerUp(
            make_plan(spec, cluster, c.plan, c.estimate, "trex planner (runner-up)", (_split_note(c),)),
            why_slower(c.estimate, result.best.estimate),
        )
        for c in result.runners_up
    ]
    too_big = [
        RunnerUp(
            make_plan(spec, cluster, c.plan, c.estimate, "trex planner (does not fit)"),
            why_too_big(c.memory, c.pipeline_s, result.best.step_time_s if result.best else None),
            c.pipeline_s,
        )
        for c in result.faster_but_too_big
    ]
    nearest = None
    if result.best is None and result.closest is not None:
        c = result.closest
        missing = shortfall(c.memory)
        nearest = make_plan(
            spec,
            cluster,
            c.plan,
            c.estimate,
            "trex planner (closest to fitting)",
            (f"does not fit: {missing['missing']:.1f} GiB missing per device",),
        )
    base = _baseline(spec, cluster, template, baseline) if baseline else None
    return PlanningResult(spec, cluster, template, result, best, runners, too_big, nearest, base)


def _empty_space(spec: ModelSpec, cluster: Cluster, template: ParallelConfig, space: SearchSpace) -> str:
    from trex.planner.space import model_facts

    heads, experts, _ = model_facts(spec)
    return (
        f"no parallel layout of {spec.name} meets the divisibility rules on {cluster.devices} devices with seq {template.seq} and global "
        f"batch {template.gbs} (search space {space.describe()}): tp must divide the {heads} attention heads and the devices, ep the "
        f"{experts or 1} experts and a stage's ranks, and the global batch must split into whole micro-batches per data-parallel rank; "
        "try a global batch that is a multiple of the device count, or widen --fix"
    )


def _baseline(spec: ModelSpec, cluster: Cluster, template: ParallelConfig, name: str) -> Baseline:
    """`name` "auto": the first of the model's public recipes that fits this run (else the first), those
    written for the run's precision first."""
    if name == "auto":
        tried = [_baseline(spec, cluster, template, recipe.name) for recipe in recipes_for(spec, template.precision)]
        chosen = next((b for b in tried if b.feasible), tried[0])
        skipped = [
            f"{b.recipe.name} does not fit this run ({'; '.join(b.violations) or 'invalid'})"
            for b in tried
            if b is not chosen and not b.feasible
        ]
        chosen.skipped.extend(skipped)
        return chosen
    recipe = get_recipe(name)
    try:
        config, adjusted = baseline_plan(recipe, spec, cluster.devices, template)
    except TrexError as error:
        return Baseline(recipe, template, [], None, [str(error)])
    differences = software_differences(recipe, spec.name, config)
    try:
        estimate = estimate_step(spec, cluster, config)
    except InfeasiblePlan as error:
        return Baseline(recipe, config, adjusted, None, list(error.violations), software_differences=differences)
    notes = (
        tuple(f"adjusted: {a}" for a in adjusted)
        + tuple(f"not modelled: {n}" for n in recipe.not_modelled)
        + tuple(differences)
    )
    plan = make_plan(spec, cluster, estimate.plan, estimate, f"baseline: {recipe.description}", notes)
    return Baseline(recipe, config, adjusted, plan, estimate.memory_violations(), software_differences=differences)
