"""What a problem family is: a generator of instance data and four independent writers.

A family generates randomized instance data (`generate`) and writes that one instance four ways:
the `LinearModel` the solver solves, the pyscipopt `program` run in the sandbox, the
`math_model` (markdown/LaTeX), and the natural-language `statement`. The writers share nothing
but the data, so the verifier's cross-checks (solver vs program vs LP file vs model structure)
compare independent encodings of one problem.

Randomness is split into streams (see `trex.workloads.or_data.seeds`): data, wording and the
what-if change each draw from their own `random.Random`, so rewording a statement never changes
the model, and a statement template can be added without changing any instance.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from trex.workloads.or_data.linear_model import LinearModel
from trex.workloads.or_data.math_model import MathModel

T = TypeVar("T")


@dataclass(frozen=True)
class Generated:
    """Instance data and the status it was built to have. `note` says, in words and with the
    numbers, why an infeasible or unbounded instance is so ("" for optimal ones)."""

    data: Any
    status: str
    note: str = ""


@dataclass(frozen=True)
class WhatIf:
    """One change: the question asked, the changed data, and what changed. A parameter change
    gives `parameter` old -> new; a structural change (an option removed, a constraint added)
    says so in `change`, with `parameter` naming the option and old/new 1 -> 0 (present -> absent)."""

    question: str
    data: Any
    parameter: str  # e.g. "capacity[Carpentry]"
    old: float
    new: float
    change: str = ""  # a structural change in words ("the route from A to B is closed"); "" for a parameter change


class Family(ABC):
    """A problem family; see the module docstring. Subclasses set the class attributes and
    implement the writers; `statuses` lists the non-optimal statuses the family can produce."""

    name: ClassVar[str]
    title: ClassVar[str]
    statuses: ClassVar[tuple[str, ...]] = ("infeasible",)

    @abstractmethod
    def generate(self, rng: random.Random, status: str) -> Generated:
        """Random instance data built to have `status` (optimal, or one of `statuses`)."""

    @abstractmethod
    def linear_model(self, data: Any) -> LinearModel: ...

    @abstractmethod
    def program(self, data: Any) -> str: ...

    @abstractmethod
    def math_model(self, data: Any) -> MathModel: ...

    @abstractmethod
    def statement(self, data: Any, rng: random.Random) -> str: ...

    @abstractmethod
    def decisions(self, data: Any, values: Mapping[str, float]) -> list[str]:
        """The optimal decisions in words, one line each (only what is nonzero or chosen)."""

    @abstractmethod
    def what_if(self, data: Any, rng: random.Random) -> WhatIf:
        """A realistic change of one parameter, asked as a question."""

    def least_reason(self, data: Any, values: Mapping[str, float]) -> str:
        """Why no plan does better than the optimum `values`, from the family's own knowledge (a
        bound any plan must meet: "the crates total 3,935 kg and 2 trucks hold 3,800 kg, so no plan
        uses fewer than 3"), or "" where the family has no such argument. Said in "What limits the
        plan", where binding rows alone may not say it (the Seventh review's #24)."""
        return ""

    def __repr__(self) -> str:
        return f"<family {self.name}>"


def scale(value: float, factor: float, *, integer: bool = True, step: float = 1.0) -> float:
    """`value * factor`, rounded to a multiple of `step` (an integer when `integer`), never
    equal to `value` unless the factor is 1."""
    changed = round(value * factor / step) * step
    if changed == value and factor != 1:
        changed = value + (step if factor > 1 else -step)
    return float(int(changed)) if integer else float(round(changed, 4))


def draw(rng: random.Random, pool: Sequence[T], low: int, high: int | None = None) -> tuple[T, ...]:
    """Between `low` and `high` distinct entries of `pool` (at most all of them), in random order:
    an instance's cast (sites, items, jobs) taken from a scenario's pool. The count is drawn
    first, then the sample."""
    high = len(pool) if high is None else min(high, len(pool))
    return tuple(rng.sample(pool, rng.randint(low, high)))


def nice(rng: random.Random, low: float, high: float, step: float = 1.0) -> float:
    """A random multiple of `step` in [low, high] (a float, integral when step is)."""
    low = math.ceil(round(low / step, 9)) * step
    count = int(round((high - low) / step, 9))
    value = low + step * rng.randint(0, max(0, count))
    return float(round(value, 4))
