"""Ground-truth answers and predictions: an objective value, "no solution", or named quantities."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from trex.workloads.or_eval.errors import DataFormatError

# How benchmarks and programs say "infeasible or unbounded" (ORLM writes "No Best Solution").
NO_SOLUTION_WORDS = frozenset(
    {
        "no best solution",
        "no solution",
        "no feasible solution",
        "no optimal solution",
        "infeasible",
        "unbounded",
        "infeasible or unbounded",
        "infeasible_or_unbounded",
    }
)

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Objective:
    """The optimal objective value."""

    value: float


@dataclass(frozen=True)
class NoSolution:
    """The problem is infeasible or unbounded (ORLM's "No Best Solution")."""


@dataclass(frozen=True)
class Quantities:
    """Named optimal quantities (OptiBench's `results`): all must match for a correct answer."""

    values: tuple[tuple[str, float], ...]

    def as_dict(self) -> dict[str, float]:
        return dict(self.values)


Answer = Objective | NoSolution | Quantities


def answer_to_json(answer: Answer) -> Any:
    if isinstance(answer, Objective):
        return answer.value
    if isinstance(answer, NoSolution):
        return "No Best Solution"
    return answer.as_dict()


def parse_answer(value: Any, path: str, line: int | None, field_name: str) -> Answer:
    """A ground truth from a benchmark file; anything unreadable is an error naming where it is."""
    if isinstance(value, dict):
        if not value:
            raise DataFormatError(path, line, "no named quantities", field_name)
        parsed = []
        for name, quantity in value.items():
            number = _strict_number(quantity)
            if number is None:
                raise DataFormatError(path, line, f"quantity {name!r} is {quantity!r}, not a number", field_name)
            parsed.append((str(name), number))
        return Quantities(tuple(parsed))
    if isinstance(value, str) and value.strip().lower() in NO_SOLUTION_WORDS:
        return NoSolution()
    number = _strict_number(value)
    if number is None:
        raise DataFormatError(path, line, f"{value!r} is neither a number nor 'No Best Solution'", field_name)
    return Objective(number)


def _strict_number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def parse_number(text: str) -> float | None:
    """The first number in free text ("$1,160.00 per day" -> 1160.0), or None."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    try:
        number = float(match.group().replace(",", ""))
    except ValueError:
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class Prediction:
    """What one sample answered: an objective, "no solution", named quantities, or nothing.

    `source` says where it was read from (see `trex.workloads.or_eval.extraction`), so a report
    can tell printed answers from solver-recorded ones.
    """

    objective: float | None = None
    no_solution: bool = False
    quantities: dict[str, float] = field(default_factory=dict)
    source: str = ""

    @property
    def empty(self) -> bool:
        return self.objective is None and not self.no_solution and not self.quantities

    def to_json(self) -> dict:
        return {
            "objective": self.objective,
            "no_solution": self.no_solution,
            "quantities": self.quantities,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: dict) -> Prediction:
        objective = data.get("objective")
        return cls(
            objective=None if objective is None else float(objective),
            no_solution=bool(data.get("no_solution", False)),
            quantities={str(k): float(v) for k, v in (data.get("quantities") or {}).items()},
            source=str(data.get("source", "")),
        )
