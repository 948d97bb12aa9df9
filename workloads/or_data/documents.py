"""Continued-pretraining documents (`cpt.jsonl`): one worked optimization case per instance.

A document tells one verified problem end to end — the situation, the formulation, the LP file,
the pyscipopt program and the solution (or why none exists) — in one of several layouts with
their own headings and section order, so the corpus does not teach one fixed page structure. The
statement is written from its own random stream, so it is a different paraphrase from the one in
the SFT sample of the same instance.
"""

from __future__ import annotations

import random

from trex.workloads.or_data.phrasing import pick
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
    "program": ("Solving it with pyscipopt", "Implementation", "Solver code (Python, SCIP)"),
    "solution": ("Solution", "Result", "What the solver finds", "Optimal plan"),
}
_TITLES = ("Worked example", "Case study", "Optimization exercise", "Modeling example")


def cpt_document(problem: Problem, statement: str, rng: random.Random) -> str:
    layout = pick(rng, _LAYOUTS)
    parts = [f"# {pick(rng, _TITLES)}: {problem.family.title}"]
    for section in layout:
        heading = pick(rng, _HEADINGS[section])
        parts.append(f"## {heading}\n\n{_section(section, problem, statement, rng)}")
    return "\n\n".join(parts).strip() + "\n"


def _section(section: str, problem: Problem, statement: str, rng: random.Random) -> str:
    if section == "problem":
        return statement
    if section == "model":
        return f"{understanding(problem.math, rng)}\n\n{problem.math.to_markdown(with_data=True)}"
    if section == "lp":
        return f"```lp\n{problem.lp.rstrip()}\n```"
    if section == "program":
        return f"```python\n{problem.program.rstrip()}\n```"
    if problem.status != "optimal":
        return no_solution_explanation(problem)
    decisions = "\n".join(f"- {line}" for line in problem.decisions())
    return f"The optimal objective value is {problem.outcome.text()}.\n\n{decisions}".strip()
