"""DTA Phase II, rewrite: a teacher's free-form answer restated in the student's style.

The rewrite keeps the teacher's substance — its explanation, its model, its program or LP file —
and changes the form: sections in the template's order, code in fenced blocks, the repair's diff
computed against the buggy program, the decisions taken from what the teacher's program printed,
and the final line stating the outcome the program reached (so the answer's last line is the
verified execution, not an unchecked claim). The programmatic teacher already writes in the style;
its parts pass through unchanged. A teacher's answer gets no Checking the plan section: that section
redoes the sums of the verified plan, and a teacher's plan may be another optimum.
"""

from __future__ import annotations

import difflib
import re

from trex.workloads.or_data.agreement import CandidateCheck
from trex.workloads.or_data.program import OBJECTIVE_MARKER
from trex.workloads.or_data.style import AnswerParts, StyleTemplate
from trex.workloads.or_data.tasks import Task
from trex.workloads.or_data.teachers import Candidate
from trex.workloads.or_eval.extraction import strip_reasoning

_FENCED = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_MARKER_LINE = re.compile(rf"^.*{OBJECTIVE_MARKER}.*$", re.IGNORECASE | re.MULTILINE)
_HEADING = re.compile(r"^#+\s.*$", re.MULTILINE)
_SHOWN = re.compile(r"^(?P<label>[^=\n]{1,120}?) = (?P<value>[-+0-9.eE]+)$", re.MULTILINE)
MAX_PROSE = 6000


def prose_of(text: str) -> str:
    """The answer without reasoning blocks, code blocks, headings and objective lines."""
    body = _FENCED.sub("", strip_reasoning(text))
    body = _MARKER_LINE.sub("", body)
    body = _HEADING.sub("", body)
    return re.sub(r"\n{3,}", "\n\n", body).strip()[:MAX_PROSE]


def printed_decisions(stdout: str) -> tuple[str, ...]:
    """`label = value` lines a program printed after its objective line."""
    tail = stdout.split(OBJECTIVE_MARKER, 1)[-1]
    return tuple(f"{match.group('label').strip()} = {match.group('value')}" for match in _SHOWN.finditer(tail))


def rewrite(candidate: Candidate, check: CandidateCheck, task: Task) -> AnswerParts:
    """The candidate's parts for the style (see the module docstring)."""
    if candidate.parts is not None:
        return candidate.parts
    prose = prose_of(candidate.text)
    paragraphs = [paragraph.strip() for paragraph in prose.split("\n\n") if paragraph.strip()]
    reasoning = paragraphs[0] if paragraphs else ""
    rest = "\n\n".join(paragraphs[1:])
    outcome = check.reached
    if task.variant == "repair":
        assert task.bug is not None
        diff = "\n".join(
            difflib.unified_diff(
                task.bug.buggy.splitlines(), check.program.splitlines(), "buggy.py", "fixed.py", n=1, lineterm=""
            )
        )
        return AnswerParts(diagnosis=prose, diff=diff, program=check.program, outcome=outcome)
    if task.variant == "what_if":
        middle = "\n\n".join(paragraphs[1:-1])
        return AnswerParts(
            reasoning=reasoning,
            math=middle,
            program=check.program,
            analysis=paragraphs[-1] if len(paragraphs) > 1 else "",
            outcome=outcome,
        )
    return AnswerParts(
        reasoning=reasoning,
        math=rest,
        lp=check.lp,
        program=check.program,
        decisions=printed_decisions(check.stdout) if outcome is not None and outcome.status == "optimal" else (),
        explanation=rest if outcome is not None and outcome.status != "optimal" else "",
        outcome=outcome,
    )


def render(style: StyleTemplate, task: Task, parts: AnswerParts) -> tuple[str, str]:
    """The rewritten answer text, or ("", why) when the parts cannot fill the layout."""
    try:
        return style.render(task.category, task.variant, parts), ""
    except ValueError as error:
        return "", str(error)
