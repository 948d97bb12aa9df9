"""The student's answer style: one fixed layout per task, declared as data.

DTA's Phase II rewrites every teacher's solution into the form the student should learn to
produce, so that the student imitates one consistent way of working rather than each teacher's
habits (Data Trajectory Alignment, arXiv:2511.06776, Sec. III). Here the form is a sequence of
markdown sections per task variant, ending with the objective marker line the evaluator reads:

| task / variant | sections |
| --- | --- |
| text_to_model / model | Understanding, Mathematical model, LP file, Optimal decision (from solving the LP file), Checking the plan, Answer |
| text_to_code / code | Understanding, Model, Program, Optimal decision (what the program printed), Checking the plan, Answer |
| model_to_code / translate | Understanding, Program, Optimal decision, Checking the plan, Answer |
| model_to_code / repair | Diagnosis, Fix, Corrected program, Answer |
| solve_analyze / decision | Understanding, Model, Program, Optimal decision (or Why there is no solution), Checking the plan, What limits the plan (binding rows, slack, dual values; optional), Answer |
| solve_analyze / what_if | Understanding, Model, Program, What changes, Checking the plan (the new plan), Answer |

Checking the plan (`worked.worked_check`, optional everywhere) redoes the optimum's arithmetic on the
instance: the objective term by term, the binding rows and the roomiest row written out, and for an LP
the reduced costs of the options left at zero.

Every answer that reaches an outcome says what the solved plan is: the decisions with units (or
why no solution exists). For a teacher whose program prints no decisions the Optimal decision
section of the model/code/translate layouts may be left out (`OPTIONAL`); the decision task
always needs it.

A `StyleTemplate` can be replaced (other headings, another system prompt); the judge checks
answers against the template in use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trex.workloads.or_data.outcome import Outcome

SYSTEM_PROMPT = (
    "You are an operations research assistant. You turn decision problems into mathematical optimization "
    "models and into Python programs that solve them (with pyscipopt and SCIP unless the user names another "
    "library such as PuLP, Pyomo or coptpy), and you explain the results. "
    "End every answer with the line `Optimal objective value: <value>`, or `infeasible` / `unbounded` in "
    "place of the value when the problem has no optimal solution."
)

# Which part of `AnswerParts` fills each section, and how it is wrapped.
SECTION_PARTS: dict[str, tuple[str, str]] = {
    "understanding": ("reasoning", "text"),
    "mathematical_model": ("math", "text"),
    "model": ("math", "text"),
    "lp_file": ("lp", "lp"),
    "program": ("program", "python"),
    "corrected_program": ("program", "python"),
    "diagnosis": ("diagnosis", "text"),
    "fix": ("diff", "diff"),
    "optimal_decision": ("decisions", "bullets"),
    "no_solution": ("explanation", "text"),
    "what_changes": ("analysis", "text"),
    "limits": ("analysis", "text"),
    "check": ("check", "text"),
    "answer": ("outcome", "marker"),
}

DEFAULT_HEADINGS = {
    "understanding": "Understanding",
    "mathematical_model": "Mathematical model",
    "model": "Model",
    "lp_file": "LP file",
    "program": "Program",
    "corrected_program": "Corrected program",
    "diagnosis": "Diagnosis",
    "fix": "Fix",
    "optimal_decision": "Optimal decision",
    "no_solution": "Why there is no solution",
    "what_changes": "What changes",
    "limits": "What limits the plan",
    "check": "Checking the plan",
    "answer": "Answer",
}

DEFAULT_LAYOUTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("text_to_model", "model"): (
        "understanding",
        "mathematical_model",
        "lp_file",
        "optimal_decision",
        "check",
        "answer",
    ),
    ("text_to_code", "code"): ("understanding", "model", "program", "optimal_decision", "check", "answer"),
    ("model_to_code", "translate"): ("understanding", "program", "optimal_decision", "check", "answer"),
    ("model_to_code", "repair"): ("diagnosis", "fix", "corrected_program", "answer"),
    ("solve_analyze", "decision"): (
        "understanding",
        "model",
        "program",
        "optimal_decision",
        "check",
        "limits",
        "answer",
    ),
    ("solve_analyze", "what_if"): ("understanding", "model", "program", "what_changes", "check", "answer"),
}


# Sections a variant may leave out when the answer has nothing for them (see the module docstring).
OPTIONAL: dict[str, frozenset[str]] = {
    variant: frozenset({"optimal_decision", "no_solution"}) for variant in ("model", "code", "translate")
}
# A decision without an inequality row to read (or with no optimum) has no limits section.
OPTIONAL["decision"] = frozenset({"limits"})
# Checking the plan needs an optimum with a nonzero decision (and a teacher may leave it out).
for _variant in ("model", "code", "translate", "decision", "what_if"):
    OPTIONAL[_variant] = OPTIONAL.get(_variant, frozenset()) | {"check"}
# A model task whose prompt gives the LP file (LP -> model) does not repeat it in the answer.
OPTIONAL["model"] = OPTIONAL["model"] | {"lp_file"}


@dataclass(frozen=True)
class AnswerParts:
    """The content of an answer, before layout. Teachers (or the rewriter, for free-form
    teacher output) fill what they have; the template decides what is shown."""

    reasoning: str = ""
    math: str = ""
    lp: str = ""
    program: str = ""
    diagnosis: str = ""
    diff: str = ""
    decisions: tuple[str, ...] = ()
    explanation: str = ""
    analysis: str = ""
    check: str = ""
    outcome: Outcome | None = None


@dataclass(frozen=True)
class StyleTemplate:
    system_prompt: str = SYSTEM_PROMPT
    headings: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_HEADINGS))
    layouts: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_LAYOUTS))

    def sections(self, category: str, variant: str, outcome: Outcome | None = None) -> tuple[str, ...]:
        """The sections of an answer; an infeasible or unbounded decision explains why there
        is no solution instead of listing decisions."""
        layout = self.layouts[category, variant]
        if outcome is not None and outcome.status != "optimal":
            layout = tuple("no_solution" if section == "optimal_decision" else section for section in layout)
        return layout

    def render(self, category: str, variant: str, parts: AnswerParts) -> str:
        """The answer text; raises ValueError naming the sections whose part is empty."""
        blocks, missing = [], []
        for section in self.sections(category, variant, parts.outcome):
            part, wrap = SECTION_PARTS[section]
            value = getattr(parts, part)
            if not value:
                if section not in OPTIONAL.get(variant, ()):
                    missing.append(section)
                continue
            blocks.append(f"## {self.headings[section]}\n\n{_wrap(value, wrap)}")
        if missing:
            raise ValueError(f"answer for {category}/{variant} lacks {', '.join(missing)}")
        return "\n\n".join(blocks).strip() + "\n"

    def headings_of(self, category: str, variant: str, outcome: Outcome | None = None) -> list[str]:
        return [self.headings[section] for section in self.sections(category, variant, outcome)]

    def accepts(self, headings: list[str], category: str, variant: str, outcome: Outcome | None = None) -> bool:
        """Whether `headings` follow the layout, optional sections present or left out."""
        full = self.sections(category, variant, outcome)
        optional = OPTIONAL.get(variant, frozenset())
        kept = [self.headings[s] for s in full if s not in optional or self.headings[s] in headings]
        return headings == kept


def _wrap(value: object, wrap: str) -> str:
    if wrap == "marker":
        assert isinstance(value, Outcome)
        return value.marker_line()
    if wrap == "bullets":
        assert isinstance(value, Sequence)
        return "\n".join(f"- {line}" for line in value)
    text = str(value).strip("\n")
    if wrap in ("python", "lp", "diff"):
        return f"```{wrap}\n{text}\n```"
    return text


def split_sections(text: str) -> dict[str, str]:
    """`## Heading` sections of a markdown answer, by heading (the text before the first
    heading is under "")."""
    sections: dict[str, str] = {}
    current, lines = "", []
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith("## "):
            sections[current] = "\n".join(lines).strip()
            current, lines = line[3:].strip(), []
        else:
            lines.append(line)
    sections[current] = "\n".join(lines).strip()
    return sections
