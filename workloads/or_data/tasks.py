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
import re
from dataclasses import dataclass

from trex.workloads.or_data.bugs import Bug, inject_bug
from trex.workloads.or_data.certificates import Certificate
from trex.workloads.or_data.families.base import WhatIf
from trex.workloads.or_data.linear_model import family_of
from trex.workloads.or_data.math_model import MathModel
from trex.workloads.or_data.outcome import Outcome, format_objective
from trex.workloads.or_data.phrasing import FRAMINGS, capitalize, join, pick
from trex.workloads.or_data.program_runner import ProgramRunner
from trex.workloads.or_data.prose import agree
from trex.workloads.or_data.prose_check import check_texts
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
        "Turn this into a mathematical program. State sets, parameters, variables, objective and constraints, then give the LP file.\n\n{statement}",
        "{statement}\n\nI need a formal optimization model of this: the algebraic formulation first, then an equivalent LP file I can load into a solver.",
        "As an operations research analyst, formulate the problem below. Define every symbol you use and finish with the model in CPLEX LP format.\n\n{statement}",
        "{statement}\n\nWhat is the optimization model here? Write it algebraically and as an LP file, and report the optimal objective value.",
        "Problem:\n\n{statement}\n\nDeliverables: (1) a mathematical model with sets, parameters, decision variables, objective and constraints; (2) the same model as an LP file.",
        "Please set up the linear (or integer) program for the following case and express it as an LP file too.\n\n{statement}",
    ),
    "code": (
        "{statement}\n\nWrite a Python program using pyscipopt that models and solves this problem.",
        "Solve the following problem with a pyscipopt program.\n\n{statement}",
        "{statement}\n\nImplement an optimization model for this in Python with pyscipopt and report the optimal value.",
        "Here is a planning problem:\n\n{statement}\n\nFormulate it and solve it with SCIP through pyscipopt.",
        "{statement}\n\nCode this up as an optimization model in Python (pyscipopt), run it, and tell me the optimal value.",
        "Write a complete pyscipopt script for the problem below. It should print the optimal objective value.\n\n{statement}",
        "Problem description:\n\n{statement}\n\nModel it and solve it in Python using SCIP (pyscipopt).",
        "{statement}\n\nSketch the model, then give a runnable pyscipopt program that solves it.",
        "Using Python and pyscipopt, build and solve a model for this situation.\n\n{statement}",
    ),
    "translate": (
        "Implement the following mathematical model in Python with pyscipopt and solve it.\n\n{math}",
        "{math}\n\nWrite a pyscipopt program for this model and report its optimal objective value.",
        "Translate this optimization model into solver code (pyscipopt):\n\n{math}",
        "Here is a formulation:\n\n{math}\n\nCode it in pyscipopt, keeping the names of sets and parameters recognizable, and solve it.",
        "Convert the model below into a runnable Python script that uses pyscipopt.\n\n{math}",
        "{math}\n\nImplement this formulation with SCIP via pyscipopt and report the optimum.",
        "Given the following algebraic model and its data, write the solver program (Python, pyscipopt).\n\n{math}",
        "Please turn this model into pyscipopt code and run it.\n\n{math}",
    ),
    "repair": (
        "The program below should implement this model, but {symptom_clause}. Find the bug and fix it.\n\n{math}\n\n```python\n{buggy}```",
        "{math}\n\nI wrote this pyscipopt program for the model above, but {symptom_clause}. What is wrong?\n\n```python\n{buggy}```",
        "Debug this pyscipopt implementation of the model that follows it; {symptom_clause}.\n\n```python\n{buggy}```\n\n{math}",
        "{math}\n\nA colleague implemented the model above as follows, but {symptom_clause}. Locate the mistake and give a corrected program.\n\n```python\n{buggy}```",
        "This code is supposed to solve the model given after it, yet {symptom_clause}. Diagnose and fix it.\n\n```python\n{buggy}```\n\n{math}",
        "Code review request: {symptom_clause}.\n\n```python\n{buggy}```\n\nThe intended model:\n\n{math}",
    ),
    "decision": (
        "{statement}\n\nSolve this problem and describe the optimal decision.",
        "{statement}\n\nWhat should be done, and what is the optimal objective value?",
        "Find the optimal plan for the following problem and explain it.\n\n{statement}",
        "{statement}\n\nWhat is the best plan? Give the decision in full and its objective value.",
        "Help me decide.\n\n{statement}\n\nSolve it and spell out what to do.",
        "{statement}\n\nRecommend a plan, backed by an optimization model, and state the optimal value.",
        "Work out the optimal decision for this situation and report it with units.\n\n{statement}",
        "{statement}\n\nFormulate, solve, and explain the resulting decision.",
    ),
    "what_if": (
        "{statement}\n\nSolve the problem. Then: {question} Re-solve with that change and compare the two results.",
        "{statement}\n\n{question} Work out the optimal plan under this change and say how the optimum moves compared with the original data.",
        "Consider this problem:\n\n{statement}\n\nScenario analysis: {question} Solve both versions and compare.",
        "{statement}\n\nSensitivity question: {question} Compare the optimal plans before and after the change.",
        "{statement}\n\nFirst find the optimum. Then answer: {question} Explain what changes in the plan and why.",
        "Here is the base case:\n\n{statement}\n\nNow suppose this: {question} How do the optimal plan and value change?",
        "{statement}\n\nManagement asks: {question} Re-optimize and explain the effect on the plan and the objective.",
    ),
}


def understanding(math: MathModel, rng: random.Random | None = None) -> str:
    """What the problem asks and why each part of the model is there, from the model's typed
    phrases (`VarDef.noun`/`indicator`/`whole`, `ConstraintDef.why`/`technique`): the decisions,
    the goal, every constraint with its reason, and why the variables are (or need not be)
    whole numbers. `rng` picks among equivalent phrasings."""
    rng = rng or random.Random(0)
    decisions = [variable.indicator or f"the {variable.noun}" for variable in math.variables]
    lead = pick(rng, ("The decisions are {x}.", "We have to decide {x}.", "The model chooses {x}.", "What is to be decided: {x}."))
    goal_verb = "minimize" if math.sense == "minimize" else "maximize"
    extreme = "as low" if math.sense == "minimize" else "as high"
    goal = pick(rng, (
        f"The goal is to {goal_verb} the {math.objective_description}.",
        f"We want the {math.objective_description} {extreme} as possible.",
        f"The objective is to {goal_verb} the {math.objective_description}.",
    ))
    paragraphs = [f"{lead.format(x=join(decisions))} {goal}"]
    if math.constraints:
        intro = pick(rng, ("The constraints, and why each is needed:", "What restricts the plan, and why:", "Each rule of the model comes from the problem:"))
        lines = []
        for constraint in math.constraints:
            why = constraint.why or constraint.description
            line = f"- {constraint.label}: {why}."
            if constraint.technique:
                line += f" {constraint.technique}"
            lines.append(line)
        paragraphs.append(intro + "\n" + "\n".join(lines))
    else:
        paragraphs.append("No constraint links the decisions: each quantity is limited only by its own bounds.")
    if any(_has_bound(variable.symbol, variable.domain) for variable in math.variables):
        paragraphs.append(pick(rng, (
            "Limits on a single quantity (minimums, caps) are written as bounds on its variable rather than as separate constraints.",
            "Minimums and caps that concern one variable only are bounds on that variable, not constraints.",
        )))
    integral, binary = [], []
    for variable in math.variables:
        if r"\{0, 1\}" in variable.domain:
            binary.append(variable.indicator or f"the {variable.noun}")
        elif "mathbb{Z}" in variable.domain:
            integral.append(f"the {variable.noun} must be whole numbers" + (f" because {variable.whole}" if variable.whole else ", as the problem states"))
    sentences = []
    if binary:
        sentences.append(f"{capitalize(join(binary))} {'is a yes/no choice' if len(binary) == 1 else 'are yes/no choices'}, modelled with binary (0/1) variables.")
    if integral:
        sentences.append(capitalize(join(integral)) + ".")
    if sentences:
        sentences.append(pick(rng, ("So this is a mixed-integer program.", "This makes it a mixed-integer program (MIP).")))
    else:
        sentences.append(pick(rng, (
            "Every quantity may take fractional values, so this is a linear program.",
            "Nothing has to be a whole number, so this is a linear program (LP) and its optimum is proven by LP duality.",
        )))
    paragraphs.append(" ".join(sentences))
    return agree("\n\n".join(paragraphs))


def _has_bound(symbol: str, domain: str) -> bool:
    """Whether a variable's domain carries a bound given by a parameter (a minimum or a cap),
    not just nonnegativity or integrality: anything named in it besides the variable itself."""
    rest = re.sub(r"\\[a-zA-Z]+(?:\{[^}]*\})?", " ", domain).replace(symbol, " ")
    return bool(re.search(r"[a-zA-Z]", rest))


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
    docstring for the fallbacks). Raises `VerificationFailed("prose", ...)` when the prompt or
    the reference answer trips the prose checker (`prose_check`), naming the flags."""
    task = _build_task(task_id, problem, category, variant, text_rng=text_rng, task_rng=task_rng, runner=runner)
    flags = check_texts([task.prompt, *_reference_texts(task.reference)])
    if flags:
        raise VerificationFailed("prose", "; ".join(str(flag) for flag in flags[:5]))
    return task


def _without_framing(statement: str) -> str:
    first, _, rest = statement.partition("\n\n")
    return rest if first in FRAMINGS and rest else statement


def _reference_texts(parts: AnswerParts) -> list[str]:
    program = f"```python\n{parts.program}\n```" if parts.program else ""
    return [parts.reasoning, parts.math, parts.diagnosis, parts.explanation, parts.analysis, program, "\n".join(parts.decisions)]


def _build_task(
    task_id: str,
    problem: Problem,
    category: str,
    variant: str,
    *,
    text_rng: random.Random,
    task_rng: random.Random,
    runner: ProgramRunner,
) -> Task:
    if variant not in VARIANTS[category]:
        raise ValueError(f"task {category!r} has no variant {variant!r}; valid: {', '.join(VARIANTS[category])}")
    statement = problem.statement(text_rng)
    math_full = problem.math.to_markdown(with_data=True)
    math_brief = problem.math.to_markdown(with_data=False)
    base_parts = dict(reasoning=understanding(problem.math, text_rng), outcome=problem.outcome)

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
            template = pick(task_rng, _PROMPTS["what_if"])
            if not template.startswith("{"):
                statement = _without_framing(statement)
            prompt = template.format(statement=statement, question=agree(what_if.question))
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
    if not template.startswith("{"):
        statement = _without_framing(statement)  # the template's own lead-in frames it
    prompt = template.format(statement=statement, math=math_full)
    solved = dict(decisions=tuple(problem.decisions()), explanation=no_solution_explanation(problem) if problem.status != "optimal" else "")
    if variant == "model":
        parts = AnswerParts(math=math_full, lp=problem.lp, **solved, **base_parts)
    elif variant == "code":
        parts = AnswerParts(math=math_brief, program=problem.program, **solved, **base_parts)
    elif variant == "translate":
        parts = AnswerParts(program=problem.program, **solved, **base_parts)
    else:  # decision
        parts = AnswerParts(math=math_brief, program=problem.program, **solved, **base_parts)
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
