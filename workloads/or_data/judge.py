"""DTA Phase II, reflection judge: a pluggable review of every rewritten answer.

A `Judge` reviews a batch of (task, rewritten answer, agreement check) and returns a `Verdict`
per answer. Judges combine with `JudgePanel` (every member must pass).

- `ProgrammaticJudge` re-solves and checks structure: the answer's sections follow the style's
  layout; the program (run in the sandbox) or LP file (solved by SCIP, and again by HiGHS)
  reaches the verified outcome; the stated final line matches what was reached; the LP file has the ground
  truth's number of variables and integer variables; programs parse, use pyscipopt, solve, and
  print the objective marker; a repair changes the buggy program; a what-if compares the old and
  new optimum; a decision lists decisions.
- `ClientJudge` asks a model (any OR-evaluator client) to reflect on the answer against the
  problem and reply `VERDICT: PASS` or `VERDICT: FAIL`; answers without a verdict fail.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from trex.workloads.llm_clients.base import Client
from trex.workloads.or_data.agreement import CandidateCheck
from trex.workloads.or_data.outcome import Outcome, outcome_from_text
from trex.workloads.or_data.program import OBJECTIVE_MARKER
from trex.workloads.or_data.prose_check import check_prose
from trex.workloads.or_data.solve import lp_counts_scip, solve_lp_text_highs
from trex.workloads.or_data.style import AnswerParts, StyleTemplate, split_sections
from trex.workloads.or_data.tasks import Task
from trex.workloads.or_data.teachers import ask

MAX_LP_CHARS = 400_000


@dataclass(frozen=True)
class Review:
    """What a judge sees: the task, the rewritten answer and its parts, and the agreement check."""

    task: Task
    text: str
    parts: AnswerParts
    check: CandidateCheck


@dataclass(frozen=True)
class Verdict:
    judge: str
    passed: bool
    reasons: tuple[str, ...] = ()  # why it failed (empty when passed)

    def to_json(self) -> dict:
        return {"judge": self.judge, "passed": self.passed, "reasons": list(self.reasons)}


class Judge(Protocol):
    name: str

    def review(self, items: Sequence[Review]) -> list[Verdict]: ...


class ProgrammaticJudge:
    """Re-solves and checks structure (see the module docstring)."""

    name = "programmatic"

    def __init__(self, style: StyleTemplate | None = None):
        self.style = style or StyleTemplate()

    def review(self, items: Sequence[Review]) -> list[Verdict]:
        return [Verdict(self.name, not reasons, tuple(reasons)) for reasons in map(self.problems, items)]

    def problems(self, item: Review) -> list[str]:
        task, check, parts = item.task, item.check, item.parts
        problems: list[str] = []
        headings = [heading for heading in split_sections(item.text) if heading]
        expected = self.style.headings_of(task.category, task.variant, parts.outcome)
        if not self.style.accepts(headings, task.category, task.variant, parts.outcome):
            problems.append(f"sections {headings} do not follow the layout {expected}")
        if check.reached is None:
            problems.append(f"nothing re-solves: {check.failure}")
        elif not check.reached.matches(task.truth):
            problems.append(f"re-solving reaches {check.reached.text()}, the verified answer is {task.truth.text()}")
        stated = outcome_from_text(item.text)
        if stated is None or check.reached is None or not stated.matches(check.reached):
            problems.append(
                f"the final line states {stated.text() if stated else 'nothing'}, re-solving reaches {check.answer_key()}"
            )
        problems += self._structure(item)
        problems += [f"prose: {flag}" for flag in check_prose(item.text)]
        return problems

    def _structure(self, item: Review) -> list[str]:
        task, check, parts = item.task, item.check, item.parts
        problems: list[str] = []
        if task.variant == "model":
            problems += _lp_structure(check.lp, task)
            if "$" not in parts.math:
                problems.append("the mathematical model section has no formulas")
        else:
            problems += _program_structure(check.program)
        if task.variant == "repair" and task.bug is not None and check.program.strip() == task.bug.buggy.strip():
            problems.append("the corrected program is the buggy program")
        if task.variant == "what_if" and task.target is not task.problem:
            for label, outcome in (("original", task.problem.outcome), ("changed", task.target.outcome)):
                if outcome.text() not in parts.analysis:
                    problems.append(f"the comparison does not state the {label} optimum {outcome.text()}")
        if task.variant == "decision" and task.truth.status == "optimal" and not parts.decisions:
            problems.append("no decisions are listed")
        return problems


def _lp_structure(lp: str, task: Task) -> list[str]:
    if not lp:
        return ["there is no LP file"]
    if len(lp) > MAX_LP_CHARS:
        return [f"the LP file has {len(lp)} characters, more than {MAX_LP_CHARS}"]
    problems = []
    highs = solve_lp_text_highs(lp)
    if highs.status == "other" or not Outcome(highs.status, highs.objective).matches(task.truth):
        problems.append(
            f"HiGHS re-solves the LP file to {highs.status} {highs.objective!r} ({highs.solver_status}), the verified answer is {task.truth.text()}"
        )
    counts = lp_counts_scip(lp)
    truth = task.target.model
    expected = (len(truth.variables), sum(variable.integral for variable in truth.variables))
    if counts is None:
        problems.append("SCIP cannot read the LP file")
    elif counts != expected:
        problems.append(
            f"the LP file has {counts[0]} variables ({counts[1]} integer), the problem has {expected[0]} ({expected[1]} integer)"
        )
    return problems


def _program_structure(program: str) -> list[str]:
    if not program:
        return ["there is no program"]
    try:
        tree = ast.parse(program)
    except SyntaxError as error:
        return [f"the program does not parse: line {error.lineno}: {error.msg}"]
    imports: set[str] = set()
    calls: set[str] = set()  # attribute calls: model.optimize(), pulp.LpVariable(...)
    names: set[str] = set()  # every called name, attribute or plain
    for node in ast.walk(tree):  # one walk of the tree (a program is judged once per candidate)
        if isinstance(node, ast.Import):
            imports.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imports.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                calls.add(node.func.attr)
                names.add(node.func.attr)
            elif isinstance(node.func, ast.Name):
                names.add(node.func.id)
    problems = []
    # what each solver library's program must contain: its import, a solve call, variables
    libraries = {
        "pyscipopt": ({"optimize"}, {"addVar"}),
        "pulp": ({"solve"}, {"LpVariable"}),
        "pyomo": ({"solve"}, {"Var"}),
        "coptpy": ({"solve"}, {"addVar"}),
    }
    used = [library for library in libraries if library in imports]
    if not used:
        problems.append(f"the program uses none of the solver libraries {', '.join(libraries)}")
    else:
        solves, declares = libraries[used[0]]
        if not solves & calls:
            problems.append(f"the program never calls {'/'.join(sorted(solves))}()")
        if not declares & (calls | names):
            problems.append(f"the program declares no variables ({'/'.join(sorted(declares))})")
    if OBJECTIVE_MARKER.lower() not in program.lower():
        problems.append(f"the program does not print `{OBJECTIVE_MARKER}: ...`")
    return problems


_JUDGE_PROMPT = """You are reviewing a worked solution to an operations research task. Reflect on it step by step: does the model capture every decision, restriction and number in the task, with the right directions and units? Does the program implement that model? Is the conclusion supported?

# Task
{task}

# Solution
{answer}

# Your review
Finish with one line `VERDICT: PASS` if the solution is correct and complete, otherwise `VERDICT: FAIL`, followed by one sentence saying why."""

_VERDICT = re.compile(r"VERDICT:\s*\**\s*(PASS|FAIL)", re.IGNORECASE)


class ClientJudge:
    """Reflection by a model behind an OR-evaluator client (see the module docstring)."""

    def __init__(self, client: Client, name: str = "reflection"):
        self.client, self.name = client, name

    def review(self, items: Sequence[Review]) -> list[Verdict]:
        prompts = [
            (f"{item.task.id}:{index}", item.task, _JUDGE_PROMPT.format(task=item.task.prompt, answer=item.text))
            for index, item in enumerate(items)
        ]
        texts, error = ask(self.client, prompts)
        verdicts = []
        for text in texts:
            if text is None:
                verdicts.append(Verdict(self.name, False, (f"no review: {error or 'no completion'}",)))
                continue
            found = _VERDICT.findall(text)
            if not found:
                verdicts.append(Verdict(self.name, False, ("the review states no VERDICT",)))
            elif found[-1].upper() == "PASS":
                verdicts.append(Verdict(self.name, True))
            else:
                tail = text[text.upper().rfind("VERDICT") :][:300]
                verdicts.append(Verdict(self.name, False, (f"reflection: {tail.strip()}",)))
        return verdicts


class JudgePanel:
    """Judges in sequence; an answer passes when every judge passes it. Later judges see only
    answers the earlier ones passed (a model judge is not asked about a program that failed)."""

    def __init__(self, judges: Sequence[Judge]):
        if not judges:
            raise ValueError("a judge panel needs at least one judge")
        self.judges = list(judges)
        self.name = "+".join(judge.name for judge in judges)

    def review(self, items: Sequence[Review]) -> list[Verdict]:
        verdicts = [Verdict(self.name, True) for _ in items]
        for judge in self.judges:
            open_items = [index for index, verdict in enumerate(verdicts) if verdict.passed]
            if not open_items:
                break
            for index, verdict in zip(open_items, judge.review([items[index] for index in open_items]), strict=True):
                if not verdict.passed:
                    verdicts[index] = Verdict(
                        self.name, False, tuple(f"{judge.name}: {reason}" for reason in verdict.reasons)
                    )
        return verdicts
