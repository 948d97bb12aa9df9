"""What a problem's answer is (`Outcome`: a status and, when optimal, the objective), how it is
written, and how it is read back from a program's output or a response's text.

Unlike the evaluator's `Prediction`, which folds infeasible and unbounded into "no solution"
(benchmarks label both "No Best Solution"), an outcome keeps them apart: an answer that calls an
unbounded problem infeasible is wrong here. Objectives compare under the evaluator's strict rule
(`|p - g| / (|g| + 1) < 1e-6`, `trex.workloads.or_eval.scoring`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from trex.workloads.or_data.program import OBJECTIVE_MARKER
from trex.workloads.or_eval.extraction import extract_final_answer, prediction_from_run, strip_reasoning
from trex.workloads.or_eval.scoring import Rule, values_match
from trex.workloads.sandbox import SolveRecord

_MARKER = re.compile(rf"^\s*{OBJECTIVE_MARKER}\s*[:=]\s*(?P<value>.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_STATUS_WORDS = {"infeasible": "infeasible", "unbounded": "unbounded"}


@dataclass(frozen=True)
class Outcome:
    status: str  # optimal | infeasible | unbounded
    objective: float | None = None

    def matches(self, truth: Outcome) -> bool:
        if self.status != truth.status:
            return False
        if self.status != "optimal":
            return True
        return (
            self.objective is not None
            and truth.objective is not None
            and values_match(self.objective, truth.objective, Rule.STRICT)
        )

    def text(self) -> str:
        """`1160`, `267.5`, `infeasible`: how answers state it."""
        return (
            format_objective(self.objective) if self.status == "optimal" and self.objective is not None else self.status
        )

    def marker_line(self) -> str:
        return f"{OBJECTIVE_MARKER}: {self.text()}"

    def to_json(self) -> dict:
        return {"status": self.status, "objective": self.objective}


def tidy_objective(value: float) -> float:
    """The simplest fraction (denominator at most 1000) within 1e-9 (relative) of `value`, else
    `value`: floating-point residue such as 267.50000000000006 becomes 267.5; any value that
    differs from a simple fraction by more than rounding error keeps every digit."""
    simple = Fraction(value).limit_denominator(1000)
    if abs(float(simple) - value) <= 1e-9 * (abs(value) + 1):
        return float(simple)
    return value


def format_objective(value: float) -> str:
    """At most six decimals, no trailing zeros, no `-0`: exact under the strict rule."""
    rounded = round(float(value), 6)
    if rounded == 0:
        return "0"
    if rounded.is_integer():
        return str(int(rounded))
    return f"{rounded:.6f}".rstrip("0").rstrip(".")


def _word(value: str) -> str | None:
    cleaned = value.strip().strip("`*$.").strip().lower()
    for word, status in _STATUS_WORDS.items():
        if cleaned.startswith(word):
            return status
    return None


def outcome_from_run(stdout: str, solves: Sequence[SolveRecord]) -> Outcome | None:
    """The outcome a finished program reported: its last objective marker (a number or a
    status word), else the last solve the recorders saw, else an objective-like printed line."""
    markers = list(_MARKER.finditer(stdout))
    if markers:
        value = markers[-1].group("value")
        status = _word(value)
        if status is not None:
            return Outcome(status)
    if solves and solves[-1].status in _STATUS_WORDS:
        return Outcome(solves[-1].status)
    prediction = prediction_from_run(stdout, solves)
    if prediction.objective is not None:
        return Outcome("optimal", prediction.objective)
    return None


def outcome_from_text(text: str) -> Outcome | None:
    """The final answer a response states: the last objective marker line, else a boxed value,
    else "the answer is ..." (via the evaluator's `extract_final_answer`)."""
    body = strip_reasoning(text)
    markers = list(_MARKER.finditer(body))
    if markers:
        status = _word(markers[-1].group("value"))
        if status is not None:
            return Outcome(status)
    prediction = extract_final_answer(body)
    if prediction.objective is not None:
        return Outcome("optimal", prediction.objective)
    if prediction.no_solution:
        tail = body[-400:].lower()
        found = [(tail.rfind(word), status) for word, status in _STATUS_WORDS.items() if word in tail]
        if found:
            return Outcome(max(found)[1])
    return None
