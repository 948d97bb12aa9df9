"""The four task categories, built from one verified problem (examples: `TASKS.md`).

| category | variant | the user gives | a correct answer gives | reaches the outcome of |
| --- | --- | --- | --- | --- |
| text_to_model | model | the statement | mathematical model + LP file | the problem |
| text_to_code | code | the statement | model summary + pyscipopt program | the problem |
| model_to_code | translate | the mathematical model (with data) | pyscipopt program | the problem |
| model_to_code | repair | the model and a buggy program | diagnosis, diff, corrected program | the problem |
| solve_analyze | decision | the statement | program, the optimal decision (or why none exists) | the problem |
| solve_analyze | what_if | the statement and a parameter change | program for the changed data, comparison | the changed problem, re-solved and verified |

`Task.reference` is the answer written from the ground truth (what the programmatic teacher
says); `Task.target` is the verified problem whose outcome a correct answer must reach.
Repair needs a mutation that demonstrably changes the result and what-if needs the changed
problem to verify; when either is impossible for an instance the task falls back to translate
or decision, and `Task.fallback` says so.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from trex.workloads.or_data.bugs import Bug, inject_bug
from trex.workloads.or_data.certificates import Certificate
from trex.workloads.or_data.families.base import WhatIf
from trex.workloads.or_data.linear_model import family_of
from trex.workloads.or_data.math_model import MathModel
from trex.workloads.or_data.outcome import Outcome, format_objective
from trex.workloads.or_data.phrasing import join, pick
from trex.workloads.or_data.program_runner import ProgramRunner
from trex.workloads.or_data.style import AnswerParts
from trex.workloads.or_data.verify import Problem, VerificationFailed, verify_problem

CATEGORIES = ("text_to_model", "text_to_code", "model_to_code", "solve_analyze")
VARIANTS: dict[str, tuple[str, ...]] = {
    "text_to_model": ("model",),
    "text_to_code": ("code",),
    "model_to_code": ("translate", "repair"),
    "solve_analyze": ("decision", "what_if"),
}
# Representations a task takes in and produces: text (statement), math (model), lp, code, answer.
REPRESENTATIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "model": (("text",), ("math", "lp")),
    "code": (("text",), ("math", "code")),
    "translate": (("math",), ("code",)),
    "repair": (("math", "code"), ("code",)),
    "decision": (("text",), ("math", "code", "answer")),
    "what_if": (("text",), ("math", "code", "answer")),
}


@dataclass(frozen=True)
class Task:
    id: str
    category: str
    variant: str
    prompt: str
    problem: Problem  # the generated instance
    target: Problem  # what the answer is about: the instance, or its what-if change
    reference: AnswerParts
    statement: str = ""
    bug: Bug | None = None
    what_if: WhatIf | None = None
    fallback: str = ""  # "repair->translate" when the planned variant was impossible

    @property
    def family(self) -> str:
        return self.problem.family.name

    @property
    def truth(self) -> Outcome:
        return self.target.outcome

    @property
    def inputs(self) -> tuple[str, ...]:
        return REPRESENTATIONS[self.variant][0]

    @property
    def outputs(self) -> tuple[str, ...]:
        return REPRESENTATIONS[self.variant][1]


_PROMPTS = {
    "model": (
        "{statement}\n\nFormulate a mathematical optimization model for this problem: define the sets, parameters, decision variables, objective and constraints. Then write the same model as a CPLEX LP file.",
        "Build the mathematical model (sets, parameters, variables, objective, constraints) of the problem below, and give it in LP format as well.\n\n{statement}",
        "{statement}\n\nWrite down the linear or mixed-integer programming model of this problem and its LP-file version.",
        "Model the following situation as an optimization problem. Give the formulation in mathematical notation and as an LP file.\n\n{statement}",
    ),
    "code": (
        "{statement}\n\nWrite a Python program using pyscipopt that models and solves this problem.",
        "Solve the following problem with a pyscipopt program.\n\n{statement}",
        "{statement}\n\nImplement an optimization model for this in Python with pyscipopt and report the optimal value.",
        "Here is a planning problem:\n\n{statement}\n\nFormulate it and solve it with SCIP through pyscipopt.",
    ),
    "translate": (
        "Implement the following mathematical model in Python with pyscipopt and solve it.\n\n{math}",
        "{math}\n\nWrite a pyscipopt program for this model and report its optimal objective value.",
        "Translate this optimization model into solver code (pyscipopt):\n\n{math}",
    ),
    "repair": (
        "The program below should implement this model, but {symptom_clause}. Find the bug and fix it.\n\n{math}\n\n```python\n{buggy}```",
        "{math}\n\nI wrote this pyscipopt program for the model above, but {symptom_clause}. What is wrong?\n\n```python\n{buggy}```",
        "Debug this pyscipopt implementation of the model that follows it; {symptom_clause}.\n\n```python\n{buggy}```\n\n{math}",
    ),
    "decision": (
        "{statement}\n\nSolve this problem and describe the optimal decision.",
        "{statement}\n\nWhat should be done, and what is the optimal objective value?",
        "Find the optimal plan for the following problem and explain it.\n\n{statement}",
    ),
    "what_if": (
        "{statement}\n\nSolve the problem. Then: {question} Re-solve with that change and compare the two results.",
        "{statement}\n\n{question} Work out the optimal plan under this change and say how the optimum moves compared with the original data.",
        "Consider this problem:\n\n{statement}\n\nScenario analysis: {question} Solve both versions and compare.",
    ),
}


def understanding(math: MathModel) -> str:
    """A short account of the problem's decisions, goal and restrictions, from the model."""
    decisions = join([variable.description.replace("$", "") for variable in math.variables])
    restrictions = join([constraint.description for constraint in math.constraints])
    goal = "minimize" if math.sense == "minimize" else "maximize"
    text = f"The decisions are the {decisions}. The goal is to {goal} the {math.objective_description}, subject to these rules: {restrictions}."
    integral = [v.description.replace("$", "") for v in math.variables if "mathbb{Z}" in v.domain or r"\{0, 1\}" in v.domain]
    if integral:
        text += f" The {join(integral)} must take whole-number values, so this is a mixed-integer program."
    else:
        text += " All variables are continuous, so this is a linear program."
    return text


def no_solution_explanation(problem: Problem) -> str:
    """Why an infeasible or unbounded problem has no optimal solution, with the checked
    certificate behind the claim."""
    certificate: Certificate | None = problem.certificate
    note = problem.note[:1].upper() + problem.note[1:] if problem.note else ""
    if problem.status == "infeasible":
        families = sorted({family_of(row) for row in (certificate.rows if certificate else {})})
        combined = f" Adding up the {join([f'`{name}`' for name in families])} constraints (each with a suitable weight) gives an inequality that no plan can satisfy, so the constraints contradict each other." if families else ""
        return f"The problem is infeasible. {note}.{combined}".replace("..", ".")
    ray = certificate.ray if certificate else {}
    moves = join([f"`{name}`" for name in sorted(ray)][:6])
    return (
        f"The problem is unbounded. {note}. Starting from any feasible plan, increasing {moves} together "
        "(in a fixed proportion) keeps every constraint satisfied and improves the objective without limit."
    ).replace("..", ".")


def what_if_analysis(base: Problem, changed: Problem, what_if: WhatIf) -> str:
    before, after = base.outcome, changed.outcome
    lines = [f"With the original data the optimum is {before.text()}."]
    if after.status != "optimal":
        lines.append(f"After the change ({what_if.parameter}: {format_objective(what_if.old)} -> {format_objective(what_if.new)}) the problem becomes {after.status}. {no_solution_explanation(changed)}")
        return " ".join(lines)
    assert before.objective is not None and after.objective is not None
    delta = after.objective - before.objective
    if abs(delta) <= 1e-9 * (1 + abs(before.objective)):
        lines.append(f"After the change ({what_if.parameter}: {format_objective(what_if.old)} -> {format_objective(what_if.new)}) the re-solved optimum is still {after.text()}: the change does not affect the optimal value.")
    else:
        direction = "rises" if delta > 0 else "falls"
        share = f" ({abs(delta) / abs(before.objective) * 100:.1f}%)" if before.objective else ""
        lines.append(f"After the change ({what_if.parameter}: {format_objective(what_if.old)} -> {format_objective(what_if.new)}) the re-solved optimum is {after.text()}; it {direction} by {format_objective(abs(delta))}{share}.")
    old_plan, new_plan = set(base.decisions()), changed.decisions()
    changes = [line for line in new_plan if line not in old_plan]
    if changes:
        lines.append("In the new plan: " + " ".join(changes[:8]) + (" ..." if len(changes) > 8 else ""))
    else:
        lines.append("The optimal decisions stay the same.")
    return " ".join(lines)


def build_task(
    task_id: str,
    problem: Problem,
    category: str,
    variant: str,
    *,
    text_rng: random.Random,
    task_rng: random.Random,
    runner: ProgramRunner,
) -> Task:
    """The task `category`/`variant` on `problem`, with its reference answer (see the module
    docstring for the fallbacks)."""
    if variant not in VARIANTS[category]:
        raise ValueError(f"task {category!r} has no variant {variant!r}; valid: {', '.join(VARIANTS[category])}")
    statement = problem.statement(text_rng)
    math_full = problem.math.to_markdown(with_data=True)
    math_brief = problem.math.to_markdown(with_data=False)
    base_parts = dict(reasoning=understanding(problem.math), outcome=problem.outcome)

    if variant == "repair":
        bug = inject_bug(problem.program, problem.outcome, task_rng, runner) if problem.status == "optimal" else None
        if bug is not None:
            symptom_clause = pick(task_rng, (f"when I run it {bug.symptom}", "its result is wrong", f"{bug.symptom}"))
            prompt = pick(task_rng, _PROMPTS["repair"]).format(math=math_full, buggy=bug.buggy, symptom_clause=symptom_clause)
            parts = AnswerParts(
                diagnosis=f"{bug.diagnosis} When it runs, {bug.symptom}.",
                diff=bug.diff(),
                program=problem.program,
                outcome=problem.outcome,
            )
            return Task(task_id, category, variant, prompt, problem, problem, parts, bug=bug)
        variant, fallback = "translate", "repair->translate"
    elif variant == "what_if":
        what_if = problem.family.what_if(problem.data, task_rng) if problem.status == "optimal" else None
        changed = _verified_change(problem, what_if, runner) if what_if is not None else None
        if changed is not None and what_if is not None:
            prompt = pick(task_rng, _PROMPTS["what_if"]).format(statement=statement, question=what_if.question)
            parts = AnswerParts(
                reasoning=base_parts["reasoning"],
                math=math_brief,
                program=changed.program,
                analysis=what_if_analysis(problem, changed, what_if),
                outcome=changed.outcome,
            )
            return Task(task_id, category, variant, prompt, problem, changed, parts, statement=statement, what_if=what_if)
        variant, fallback = "decision", "what_if->decision"
    else:
        fallback = ""

    template = pick(task_rng, _PROMPTS[variant])
    prompt = template.format(statement=statement, math=math_full)
    if variant == "model":
        parts = AnswerParts(math=math_full, lp=problem.lp, **base_parts)
    elif variant == "code":
        parts = AnswerParts(math=math_brief, program=problem.program, **base_parts)
    elif variant == "translate":
        parts = AnswerParts(program=problem.program, **base_parts)
    else:  # decision
        parts = AnswerParts(
            math=math_brief,
            program=problem.program,
            decisions=tuple(problem.decisions()),
            explanation=no_solution_explanation(problem) if problem.status != "optimal" else "",
            **base_parts,
        )
    uses_statement = variant in ("model", "code", "decision")
    return Task(task_id, category, variant, prompt, problem, problem, parts, statement=statement if uses_statement else "", fallback=fallback)


def _verified_change(problem: Problem, what_if: WhatIf, runner: ProgramRunner) -> Problem | None:
    """The changed instance, verified like any other (its status is whatever re-solving says,
    proven by the same certificates); None when it cannot be verified."""
    from trex.workloads.or_data.solve import solve_model

    family = problem.family
    status = solve_model(family.linear_model(what_if.data)).status
    if status not in ("optimal", "infeasible", "unbounded"):
        return None
    try:
        return verify_problem(family, what_if.data, status, _changed_note(problem, what_if, status), runner)
    except VerificationFailed:
        return None


def _changed_note(problem: Problem, what_if: WhatIf, status: str) -> str:
    if status == "optimal":
        return ""
    return f"with {what_if.parameter} = {format_objective(what_if.new)} the constraints can no longer all be met" if status == "infeasible" else f"with {what_if.parameter} = {format_objective(what_if.new)} nothing limits the objective"
