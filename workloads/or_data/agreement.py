"""DTA Phase II, agreement: what each teacher's answer actually reaches, against the solver.

Every candidate is checked the same way, the programmatic teacher's included: its LP file (for
`text_to_model`, solved by SCIP) or its program (every other task, run in the sandbox) is
executed, and the outcome it reaches is compared with the verified outcome; the final answer it states is compared too. The
ensemble's signal (`Agreement`) is how the teachers' reached outcomes spread: all the same,
split, or all wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from trex.workloads.or_data.outcome import Outcome, outcome_from_text
from trex.workloads.or_data.program_runner import ProgramRunner
from trex.workloads.or_data.tasks import Task
from trex.workloads.or_data.teachers import Candidate
from trex.workloads.or_eval.extraction import extract_code, extract_lp


@dataclass(frozen=True)
class CandidateCheck:
    """What one candidate reached by execution (`via` the program or the LP file), what it
    stated, and whether both agree with the verified outcome."""

    teacher: str
    reached: Outcome | None
    stated: Outcome | None
    via: str  # "program" | "lp" | ""
    failure: str  # why nothing was reached ("" when something was)
    stdout: str
    program: str
    lp: str
    correct: bool

    def answer_key(self) -> str:
        """The reached outcome as a comparable string ("no answer" when none)."""
        return self.reached.text() if self.reached is not None else "no answer"


def check_candidate(candidate: Candidate, task: Task, runner: ProgramRunner) -> CandidateCheck:
    if candidate.error or not candidate.text.strip():
        return CandidateCheck(candidate.teacher, None, None, "", candidate.error or "empty answer", "", "", "", False)
    stated = outcome_from_text(candidate.text)
    lp = extract_lp(candidate.text) if task.variant == "model" else None
    program = extract_code(candidate.text)
    if lp is not None:
        run, via = runner.solve_lp(lp), "lp"
    elif program is not None:
        # the programmatic teacher (structured parts) writes from the verified program: ours, no clock verdict
        run, via = runner.run(program, clock_verdict=candidate.parts is None), "program"
    else:
        what = "an LP model" if task.variant == "model" else "a Python program"
        return CandidateCheck(
            candidate.teacher, None, stated, "", f"no_program: the answer holds no {what}", "", "", "", False
        )
    reached = run.outcome
    correct = reached is not None and reached.matches(task.truth) and (stated is None or stated.matches(task.truth))
    failure = "" if reached is not None else f"{run.failure}: {run.detail}"
    return CandidateCheck(
        candidate.teacher, reached, stated, via, failure, run.stdout, program or "", lp or "", correct
    )


@dataclass(frozen=True)
class Agreement:
    """How the ensemble's reached outcomes spread. `answers` maps teacher -> reached outcome."""

    answers: dict[str, str]
    correct: tuple[str, ...]  # teachers whose answer agrees with the solver

    @property
    def distinct(self) -> int:
        return len(set(self.answers.values()))

    @property
    def disagreement(self) -> bool:
        return self.distinct > 1

    @property
    def majority(self) -> str:
        return Counter(self.answers.values()).most_common(1)[0][0] if self.answers else "no answer"

    def to_json(self) -> dict:
        return {"answers": self.answers, "correct": list(self.correct), "distinct": self.distinct}


def agreement(checks: Sequence[CandidateCheck]) -> Agreement:
    return Agreement(
        {check.teacher: check.answer_key() for check in checks},
        tuple(check.teacher for check in checks if check.correct),
    )
