"""From sample indices to results: plan, generate, verify, build the task, run DTA, write records.

    plan(config, index)          family, status, task category and variant of sample `index`
    synthesize_shard(...)        for each index of a shard:
        family.generate          randomized data built to have the planned status
        verify_problem           every check of `verify` (SCIP, certificates, LP file x2, sandbox)
        build_task               the task with its reference answer (repair/what-if verified too)
    then, for the shard's tasks together:
        DtaPipeline.run          teachers, agreement, rewrite, judge, selection
        sft_record               the SFT record
        cpt_instance             the CPT document, from a separate verified instance of the family
                                 (`SynthConfig.cpt_instances`: or the sample's own instance, or none)

Each index yields one result, the JSON object its shard file stores: the plan (`index`, `family`,
`planned_status`, `category`, `variant`, `fallback`), `result` ("emitted" or "rejected"), `stage`
(the check or step that rejected it: one of `verify.CHECKS`, "error" or "selection"), `detail`,
`seconds`, the DTA `signal`, and when emitted `sft` (the record) and `cpt` (the document).
Everything but `seconds` is a function of (seed, index), so a shard computed twice, by any
worker, is the same.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any

from trex.workloads.or_data.config import SynthConfig
from trex.workloads.or_data.cpt_separation import lp_digest
from trex.workloads.or_data.documents import cpt_document, document_plan
from trex.workloads.or_data.dta import DtaPipeline
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.judge import ClientJudge, JudgePanel, ProgrammaticJudge
from trex.workloads.or_data.program_runner import ClockLimitReached, ProgramRunner
from trex.workloads.or_data.records import sample_id, sft_record
from trex.workloads.or_data.seeds import balanced, stream
from trex.workloads.or_data.solver_libraries import choose_library
from trex.workloads.or_data.style import StyleTemplate
from trex.workloads.or_data.tasks import CATEGORIES, VARIANTS, Task, build_task
from trex.workloads.or_data.verify import Problem, VerificationFailed, verify_problem
from trex.workloads.sandbox.interruption import RunIncomplete

# Task slots: every block of eight consecutive indices has each slot once, so the categories get a
# quarter each and the two variants of a category an eighth each.
TASK_SLOTS: tuple[tuple[str, str], ...] = tuple(
    (category, variant) for category in CATEGORIES for variant in VARIANTS[category] * (2 // len(VARIANTS[category]))
)
# Variants that need an optimal instance; infeasible/unbounded instances take the other variant.
_NEEDS_OPTIMUM = {"repair": "translate", "what_if": "decision"}


@dataclass(frozen=True)
class Plan:
    index: int
    family: str
    status: str
    category: str
    variant: str


_GOLDEN = (5**0.5 - 1) / 2  # the golden-ratio conjugate: the most evenly spread Weyl sequence


def plan(config: SynthConfig, index: int) -> Plan:
    """Families and task slots are balanced in blocks (`seeds.balanced`); the status is drawn
    with the configured shares, the unbounded share concentrated on the families that can be
    unbounded so the overall share holds. The draw for a family's k-th sample (its block) is
    the k-th point of a golden-ratio (Weyl) sequence from a per-family random start: its shares
    stay within about one sample of the configured ones per family, where independent draws
    would scatter them (with 2 of 18 families able to be unbounded, i.i.d. draws put seed
    2341's 1,000 samples at 4.3% unbounded for 3% configured)."""
    family_name = balanced(config.seed, index, config.families, "family")
    category, variant = balanced(config.seed, index, TASK_SLOTS, "task")
    can_be_unbounded = [name for name in config.families if "unbounded" in FAMILIES[name].statuses]
    unbounded = 0.0
    if "unbounded" in FAMILIES[family_name].statuses:
        # capped at half of those families: with 2 of 17 families able to be unbounded, shares up to
        # about 5.9% are reachable
        unbounded = min(0.5, config.unbounded_share * len(config.families) / len(can_be_unbounded))
    block = index // len(config.families)
    draw = (stream(config.seed, 0, f"status:{family_name}").random() + block * _GOLDEN) % 1.0
    status = (
        "unbounded" if draw < unbounded else "infeasible" if draw < unbounded + config.infeasible_share else "optimal"
    )
    if status != "optimal" and variant in _NEEDS_OPTIMUM:
        variant = _NEEDS_OPTIMUM[variant]
    return Plan(index, family_name, status, category, variant)


class ShardContext:
    """What a worker needs to make samples: the sandbox runner, the style, the DTA pipeline
    (teachers and judge built from the config). One per process."""

    def __init__(self, config: SynthConfig, *, teachers=None, judge=None, hide: tuple[str, ...] = ()):
        self.config = config
        self.style = StyleTemplate()
        self.runner = ProgramRunner(isolation=config.isolation, hide=hide)
        teachers = teachers if teachers is not None else [spec.build_teacher(self.style) for spec in config.teachers]
        if judge is None:
            judge = ProgrammaticJudge(self.style)
            if config.reflection is not None:
                judge = JudgePanel([judge, ClientJudge(config.reflection.client(), name=config.reflection.name)])
        self.dta = DtaPipeline(teachers, self.runner, judge=judge, policy=config.policy, style=self.style)

    def close(self) -> None:
        for teacher in self.dta.teachers:
            teacher.close()
        self.runner.close()


def _rejected(plan_: Plan, stage: str, detail: str, started: float) -> dict[str, Any]:
    return {
        **_plan_json(plan_),
        "result": "rejected",
        "stage": stage,
        "detail": detail[:500],
        "seconds": round(time.monotonic() - started, 4),
        "sft": None,
        "cpt": None,
    }


def _plan_json(plan_: Plan) -> dict[str, Any]:
    return {
        "index": plan_.index,
        "family": plan_.family,
        "planned_status": plan_.status,
        "category": plan_.category,
        "variant": plan_.variant,
    }


CPT_ATTEMPTS = 3


def cpt_instance(config: SynthConfig, plan_: Plan, context: ShardContext, problem: Problem) -> dict[str, Any] | None:
    """The CPT document of index `plan_.index` (`problem`: its SFT sample's instance), by
    `config.cpt_instances`: "separate", about a separate instance of the same family (its own
    data stream, verified like any SFT instance), so continued pretraining never shows an SFT
    problem, with `lp_digest` identifying the instance for the decontamination against the SFT set
    (`cpt_separation`), None when no attempt verifies; "same", about `problem` itself; "none": None."""
    if config.cpt_instances == "none":
        return None
    if config.cpt_instances == "same":
        text = cpt_document(
            problem,
            problem.statement(stream(config.seed, plan_.index, "cpt_text")),
            stream(config.seed, plan_.index, "cpt_layout"),
        )
        return {"text": text}
    family = FAMILIES[plan_.family]
    layout_rng = stream(config.seed, plan_.index, "cpt_layout")
    shown = document_plan(layout_rng)
    for attempt in range(CPT_ATTEMPTS):
        generated = family.generate(stream(config.seed, plan_.index, f"cpt_data:{attempt}"), plan_.status)
        try:
            separate = verify_problem(
                family,
                generated.data,
                generated.status,
                generated.note,
                context.runner,
                run_program="program" in shown,  # every other check always runs
            )
        except VerificationFailed:
            continue
        document = cpt_document(
            separate, separate.statement(stream(config.seed, plan_.index, "cpt_text")), layout_rng, shown
        )
        return {"text": document, "lp_digest": lp_digest(separate.lp)}
    return None


def synthesize_shard(indices: range, context: ShardContext) -> list[dict[str, Any]]:
    """One result per index, in index order (see the module docstring)."""
    config = context.config
    results: dict[int, dict[str, Any]] = {}
    tasks: list[tuple[Plan, Task, float]] = []
    for index in indices:
        started = time.monotonic()
        plan_ = plan(config, index)
        family = FAMILIES[plan_.family]
        try:
            generated = family.generate(stream(config.seed, index, "data"), plan_.status)
            library = choose_library(plan_.variant, stream(config.seed, index, "library"))
            problem = verify_problem(
                family, generated.data, generated.status, generated.note, context.runner, library=library
            )
            task = build_task(
                sample_id(config.seed, index),
                problem,
                plan_.category,
                plan_.variant,
                text_rng=stream(config.seed, index, "text"),
                task_rng=stream(config.seed, index, "task"),
                runner=context.runner,
            )
        except VerificationFailed as failure:
            results[index] = _rejected(plan_, failure.check, failure.detail, started)
            continue
        except ClockLimitReached as error:
            raise ClockLimitReached(f"index {index}: {error}") from None  # no verdict: the shard is redone
        except RunIncomplete:
            raise  # interrupted, or the sandbox failed: no verdict on this index, the shard is redone
        except Exception as error:  # noqa: BLE001 - a generator bug must not end the run; it is counted and reported
            results[index] = _rejected(
                plan_, "error", f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=3)}", started
            )
            continue
        tasks.append((plan_, task, time.monotonic() - started))

    if tasks:
        rngs = {task.id: stream(config.seed, plan_.index, "selection") for plan_, task, _ in tasks}
        started = time.monotonic()
        try:
            decisions = context.dta.run([task for _, task, _ in tasks], rngs)
        except ClockLimitReached as error:
            raise ClockLimitReached(f"indices {indices.start}-{indices.stop - 1}: {error}") from None
        dta_seconds = (time.monotonic() - started) / len(tasks)
        for (plan_, task, seconds), decision in zip(tasks, decisions, strict=True):
            base = {
                **_plan_json(plan_),
                "variant": task.variant,
                "fallback": task.fallback or None,
                "seconds": round(seconds + dta_seconds, 4),
            }
            if decision.answer is None:
                results[plan_.index] = {
                    **base,
                    "result": "rejected",
                    "stage": "selection",
                    "detail": decision.selection.reason,
                    "signal": decision.selection.signal,
                    "sft": None,
                    "cpt": None,
                }
                continue
            record = sft_record(decision, context.style, seed=config.seed, index=plan_.index)
            try:
                cpt = cpt_instance(config, plan_, context, task.problem)
            except ClockLimitReached as error:
                raise ClockLimitReached(f"index {plan_.index}: {error}") from None
            results[plan_.index] = {
                **base,
                "result": "emitted",
                "stage": None,
                "detail": "",
                "signal": decision.selection.signal,
                "sft": record,
                "cpt": cpt,
            }
    return [results[index] for index in indices]
