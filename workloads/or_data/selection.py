"""DTA Phase II, signal-aware selection: which tasks become samples, with whose answer.

Each task gets a signal from its candidates (after agreement checks and the judge):

| signal | when | kept |
| --- | --- | --- |
| single | one teacher only, and its answer passed | with probability `keep_single` (default 1) |
| unanimous | several teachers, every answer correct and passed | with probability `keep_unanimous` (default 1) |
| contested | teachers disagreed or some failed, and at least one passed | always |
| unverified | no answer passed | never |

Contested tasks are the informative ones: a verified answer exists, and some teacher got it
wrong, so the student learns where models actually fail (DTA, arXiv:2511.06776: selection keeps
exemplars by agreement and judging signals rather than uniformly). Lowering `keep_unanimous`
spends the sample budget on them. The answer emitted is the first passing candidate in
`prefer` order (teachers not named come after, in ensemble order); by default model teachers come
before the programmatic one, whose answers are always available but always alike.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from trex.workloads.or_data.teachers import PROGRAMMATIC

SIGNALS = ("single", "unanimous", "contested", "unverified")


@dataclass(frozen=True)
class SelectionPolicy:
    keep_single: float = 1.0
    keep_unanimous: float = 1.0
    prefer: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("keep_single", "keep_unanimous"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"selection {name} must lie in [0, 1], got {value}")

    def to_json(self) -> dict:
        return {"keep_single": self.keep_single, "keep_unanimous": self.keep_unanimous, "prefer": list(self.prefer)}


@dataclass(frozen=True)
class Selection:
    signal: str
    kept: bool
    chosen: str | None  # the teacher whose answer is emitted
    reason: str


def signal_of(passed: Sequence[bool]) -> str:
    if not any(passed):
        return "unverified"
    if len(passed) == 1:
        return "single"
    return "unanimous" if all(passed) else "contested"


def select(teachers: Sequence[str], passed: Sequence[bool], policy: SelectionPolicy, rng: random.Random) -> Selection:
    """The selection for one task whose candidates, from `teachers` in ensemble order, passed
    (correct and judged) or not."""
    signal = signal_of(passed)
    if signal == "unverified":
        return Selection(signal, False, None, "no teacher's answer passed the checks")
    keep_probability = {"single": policy.keep_single, "unanimous": policy.keep_unanimous, "contested": 1.0}[signal]
    draw = rng.random()  # drawn for every task, so a policy change never shifts other tasks' draws
    if draw >= keep_probability:
        return Selection(signal, False, None, f"{signal} sample dropped by the policy (keep {keep_probability:g})")
    order = sorted(range(len(teachers)), key=lambda i: _rank(teachers[i], i, policy))
    chosen = next(teachers[i] for i in order if passed[i])
    return Selection(signal, True, chosen, "")


def _rank(teacher: str, position: int, policy: SelectionPolicy) -> tuple[int, int]:
    if teacher in policy.prefer:
        return (0, policy.prefer.index(teacher))
    return (2 if teacher == PROGRAMMATIC else 1, position)
