"""Continued-pretraining documents (`cpt.jsonl`): a worked case or a conceptual note per instance.

A document tells one verified problem end to end — the situation, the formulation, the LP file,
the pyscipopt program and the solution (or why none exists) — in one of several layouts with
their own headings and section order, so the corpus does not teach one fixed page structure. The
statement is written from its own random stream, so it is a different paraphrase from the one in
the SFT sample of the same instance.

A share of the documents (`CONCEPT_SHARE`) are conceptual instead: why the formulation works
(each constraint's reason and modelling device, from the family's typed phrases), and what the
theory says about this instance, computed: for a MIP the LP relaxation's bound and the
integrality gap; for an LP the binding constraints' shadow prices and the dual bound that proves
the optimum; for an infeasible model the irreducible infeasible subset.
"""

from __future__ import annotations

import random

from trex.workloads.or_data.explain import element_words
from trex.workloads.or_data.outcome import format_objective
from trex.workloads.or_data.phrasing import pick
from trex.workloads.or_data.solver_libraries import DISPLAY
from trex.workloads.or_data.tasks import no_solution_explanation, understanding
from trex.workloads.or_data.verify import Problem

_LAYOUTS = (
    ("problem", "model", "solution", "program", "lp"),
    ("problem", "model", "lp", "program", "solution"),
    ("problem", "program", "solution"),
    ("problem", "model", "lp", "solution"),
)
_HEADINGS = {
    "problem": ("Problem", "The situation", "Problem statement", "Case description"),
    "model": ("Formulation", "Mathematical model", "Modeling the problem", "The optimization model"),
    "lp": ("LP file", "The model in LP format", "CPLEX LP formulation"),
    "program": ("Solving it with {lib}", "Implementation", "Solver code (Python, {lib})"),
    "solution": ("Solution", "Result", "What the solver finds", "Optimal plan"),
}
_TITLES = ("Worked example", "Case study", "Optimization exercise", "Modeling example")


CONCEPT_SHARE = 0.3


CONCEPT = ("concept",)


def document_plan(rng: random.Random) -> tuple[str, ...]:
    """What the document drawn from `rng` will show: `CONCEPT`, or a layout's sections. Drawn
    first (the same draws `cpt_document` makes), so that the instance is verified for what the
    document shows: a document without the program does not need the program run."""
    if rng.random() < CONCEPT_SHARE:
        return CONCEPT
    return pick(rng, _LAYOUTS)


def cpt_document(problem: Problem, statement: str, rng: random.Random, plan: tuple[str, ...] | None = None) -> str:
    """The document about `problem`; `plan`: what `document_plan` drew from the same `rng` (drawn
    here when not given)."""
    layout = plan if plan is not None else document_plan(rng)
    if layout == CONCEPT:
        return concept_document(problem, statement, rng)
    parts = [f"# {pick(rng, _TITLES)}: {problem.family.title}"]
    for section in layout:
        heading = pick(rng, _HEADINGS[section]).format(lib=DISPLAY[problem.library][0])
        parts.append(f"## {heading}\n\n{_section(section, problem, statement, rng)}")
    return "\n\n".join(parts).strip() + "\n"


def _section(section: str, problem: Problem, statement: str, rng: random.Random) -> str:
    if section == "problem":
        return statement
    if section == "model":
        return (
            f"{understanding(problem.math, rng, problem.outcome.status)}\n\n{problem.math.to_markdown(with_data=True)}"
        )
    if section == "lp":
        return f"```lp\n{problem.lp.rstrip()}\n```"
    if section == "program":
        return f"```python\n{problem.program.rstrip()}\n```"
    if problem.status != "optimal":
        return no_solution_explanation(problem)
    decisions = "\n".join(f"- {line}" for line in problem.decisions())
    return f"The optimal objective value is {problem.outcome.text()}.\n\n{decisions}".strip()


def concept_document(problem: Problem, statement: str, rng: random.Random) -> str:
    """A conceptual note on one instance (see the module docstring)."""
    title = pick(
        rng,
        (
            "Why this model works",
            "Reading a formulation",
            "Modeling notes",
            "From a story to a model, and what the solver proves",
        ),
    )
    parts = [
        f"# {title}: {problem.family.title.lower()}",
        f"## The situation\n\n{statement}",
        f"## The modeling idea\n\n{understanding(problem.math, rng, problem.outcome.status)}",
        f"## The formulation\n\n{problem.math.to_markdown(with_data=True)}",
    ]
    if problem.status == "infeasible":
        parts.append(f"## Why no plan exists\n\n{no_solution_explanation(problem)}")
    elif problem.status == "unbounded":
        parts.append(f"## Why the objective has no limit\n\n{no_solution_explanation(problem)}")
    elif problem.model.is_mip:
        parts.append(f"## The LP relaxation\n\n{_relaxation_text(problem)}")
    else:
        parts.append(f"## Duality in words\n\n{_duality_text(problem)}")
    return "\n\n".join(parts).strip() + "\n"


def _relaxation_text(problem: Problem) -> str:
    from dataclasses import replace

    from trex.workloads.or_data.solve import solve_model

    relaxed = replace(
        problem.model,
        variables=tuple(
            replace(v, kind="continuous", lower=v.lower, upper=1.0 if v.kind == "binary" else v.upper)
            for v in problem.model.variables
        ),
    )
    result = solve_model(relaxed)
    optimum = problem.outcome.objective
    if result.status != "optimal" or result.objective is None or optimum is None:
        return "Dropping integrality gives the LP relaxation; here it could not be solved to optimality, so it gives no bound."
    bound = result.objective
    side = "upper" if problem.model.sense == "maximize" else "lower"
    gap = abs(bound - optimum) / max(abs(optimum), 1e-9) * 100
    text = (
        f"Dropping the whole-number requirements turns the model into a linear program, its LP relaxation. Every integer plan is "
        f"also a plan of the relaxation, so the relaxation's optimum, {format_objective(bound)}, is an {side} bound on the integer "
        f"optimum, {format_objective(optimum)}. "
    )
    if gap < 1e-6:
        text += "Here the bound is tight: the relaxation already reaches the integer optimum, so the branch-and-bound search only has to confirm it."
    else:
        text += (
            f"The integrality gap is {gap:.1f}%: branch and bound has to close it by splitting on fractional variables, which "
            "is why tight formulations (small big-M values, strong linking constraints) matter."
        )
    return text


def _duality_text(problem: Problem) -> str:
    certificate = problem.certificate
    optimum = problem.outcome.objective
    if certificate is None or certificate.kind != "dual" or optimum is None:
        return "The optimum of a linear program is proven by a dual solution; none is recorded for this instance."
    sign = 1.0 if problem.model.sense == "minimize" else -1.0
    lines = []
    for name, multiplier in sorted(certificate.rows.items(), key=lambda item: -abs(item[1]))[:6]:
        what, whom = element_words(name, problem.math)
        lines.append(
            f"- {what}"
            + (f" for {whom}" if whom else "")
            + f": shadow price {format_objective(sign * multiplier)} per unit of right-hand side"
        )
    binding = (
        "\n".join(lines) if lines else "- no constraint carries a nonzero price: the optimum sits at variable bounds"
    )
    return (
        f"Every constraint of a linear program has a dual value (shadow price): how much the optimum would change per unit of "
        f"extra right-hand side, as long as the same constraints stay binding. For this instance:\n\n{binding}\n\n"
        f"Weighting the constraints by these prices and adding them up gives a bound of {format_objective(certificate.bound if certificate.bound is not None else optimum)} "
        f"on the objective, equal to the optimum {format_objective(optimum)} found by the solver, so no better plan exists: that "
        "equality is the certificate of optimality. Constraints with slack have price 0: loosening them changes nothing."
    )
