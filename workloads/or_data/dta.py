"""The two DTA phases over a batch of tasks (Data Trajectory Alignment, arXiv:2511.06776).

    Phase I   teachers.propose(tasks)                      one candidate per teacher and task
    Phase II  agreement.check_candidate                    run each candidate's LP file or program
              rewrite.rewrite + rewrite.render             restate it in the student's style
              judge.review                                 reflection judge (pluggable)
              selection.select                             signal-aware keep/drop and choice

Each step is a module of its own; this one only wires them, in the order above.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trex.workloads.or_data.agreement import CandidateCheck, agreement, check_candidate
from trex.workloads.or_data.judge import Judge, ProgrammaticJudge, Review, Verdict
from trex.workloads.or_data.program_runner import ProgramRunner
from trex.workloads.or_data.rewrite import render, rewrite
from trex.workloads.or_data.selection import Selection, SelectionPolicy, select
from trex.workloads.or_data.style import AnswerParts, StyleTemplate
from trex.workloads.or_data.tasks import Task
from trex.workloads.or_data.teachers import Teacher


@dataclass(frozen=True)
class Decision:
    """The DTA result for one task: the emitted answer (None when dropped) and the evidence."""

    task: Task
    answer: str | None
    parts: AnswerParts | None
    selection: Selection
    checks: tuple[CandidateCheck, ...]
    verdicts: tuple[Verdict, ...]

    def to_json(self) -> dict:
        return {
            "signal": self.selection.signal,
            "chosen": self.selection.chosen,
            "teachers": {
                check.teacher: {
                    "reached": check.answer_key(),
                    "stated": check.stated.text() if check.stated else None,
                    "correct": check.correct,
                    "judge": verdict.passed,
                    "reasons": list(verdict.reasons[:3]),
                }
                for check, verdict in zip(self.checks, self.verdicts, strict=True)
            },
            "agreement": agreement(self.checks).to_json(),
        }


class DtaPipeline:
    def __init__(
        self,
        teachers: Sequence[Teacher],
        runner: ProgramRunner,
        *,
        judge: Judge | None = None,
        policy: SelectionPolicy | None = None,
        style: StyleTemplate | None = None,
    ):
        if not teachers:
            raise ValueError("DTA needs at least one teacher")
        names = [teacher.name for teacher in teachers]
        if len(set(names)) != len(names):
            raise ValueError(f"teacher names must be distinct, got {names}")
        self.teachers = list(teachers)
        self.runner = runner
        self.style = style or StyleTemplate()
        self.judge = judge or ProgrammaticJudge(self.style)
        self.policy = policy or SelectionPolicy()

    def run(self, tasks: Sequence[Task], selection_rngs: Mapping[str, random.Random]) -> list[Decision]:
        proposals = [teacher.propose(tasks) for teacher in self.teachers]  # Phase I
        reviews: list[list[Review]] = []
        for position, task in enumerate(tasks):  # Phase II
            row = []
            for candidates in proposals:
                candidate = candidates[position]
                check = check_candidate(candidate, task, self.runner)
                parts = rewrite(candidate, check, task)
                text, _ = render(self.style, task, parts)  # "" when parts are missing: fails below
                row.append(Review(task, text, parts, check))
            reviews.append(row)
        flat = [review for row in reviews for review in row]
        verdicts = self._review(flat)
        decisions, cursor = [], 0
        for task, row in zip(tasks, reviews, strict=True):
            task_verdicts = verdicts[cursor : cursor + len(row)]
            cursor += len(row)
            passed = [
                verdict.passed and review.check.correct for review, verdict in zip(row, task_verdicts, strict=True)
            ]
            selection = select(
                [teacher.name for teacher in self.teachers], passed, self.policy, selection_rngs[task.id]
            )
            chosen = next(
                (
                    review
                    for review, teacher in zip(row, self.teachers, strict=True)
                    if teacher.name == selection.chosen
                ),
                None,
            )
            decisions.append(
                Decision(
                    task,
                    chosen.text if chosen is not None and selection.kept else None,
                    chosen.parts if chosen is not None and selection.kept else None,
                    selection,
                    tuple(review.check for review in row),
                    tuple(task_verdicts),
                )
            )
        return decisions

    def _review(self, reviews: Sequence[Review]) -> list[Verdict]:
        """Answers that could not be rendered in the style fail without reaching the judge."""
        verdicts: list[Verdict | None] = [None] * len(reviews)
        renderable = [index for index, review in enumerate(reviews) if review.text]
        for index, review in enumerate(reviews):
            if not review.text:
                _, problem = render(self.style, review.task, review.parts)
                verdicts[index] = Verdict("style", False, (problem,))
        for index, verdict in zip(renderable, self.judge.review([reviews[i] for i in renderable]), strict=True):
            verdicts[index] = verdict
        return [verdict for verdict in verdicts if verdict is not None]
