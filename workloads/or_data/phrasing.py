"""Building blocks for natural-language problem statements: choices, numbers, money, lists,
tables, and distractor facts.

Families write their own sentences (scenario nouns, several templates per fact); this module
holds what every family needs so that the statements vary in the same dimensions: how data is
presented (prose, bullet list or table), how numbers and money are written, where irrelevant
facts appear, and how the question is put.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from trex.workloads.or_data.prose import agree, number  # noqa: F401 - number is part of this module's vocabulary

T = TypeVar("T")

PRESENTATIONS = ("prose", "list", "table")


def pick(rng: random.Random, options: Sequence[T]) -> T:
    return options[rng.randrange(len(options))]


@dataclass(frozen=True)
class Currency:
    """How money is written: `$1,200`, `1,200 euros`, `EUR 1,200`."""

    symbol: str
    word: str
    style: str  # "prefix" | "word" | "code"
    code: str

    def __call__(self, value: float) -> str:
        amount = number(value)
        if not float(value).is_integer() and abs(value) < 1000:
            amount = f"{value:,.2f}"
        if self.style == "prefix":
            return f"{self.symbol}{amount}"
        if self.style == "code":
            return f"{self.code} {amount}"
        word = self.word[:-1] if float(value) == 1 and self.word.endswith("s") else self.word  # "1 dollar"
        return f"{amount} {word}"


CURRENCIES = (
    Currency("$", "dollars", "prefix", "USD"),
    Currency("$", "dollars", "word", "USD"),
    Currency("€", "euros", "prefix", "EUR"),
    Currency("€", "euros", "word", "EUR"),
    Currency("£", "pounds", "prefix", "GBP"),
    Currency("¥", "yuan", "word", "CNY"),
    Currency("", "", "code", "USD"),
    Currency("", "", "code", "EUR"),
)


def currency(rng: random.Random) -> Currency:
    return pick(rng, CURRENCIES)


def join(items: Sequence[str], rng: random.Random | None = None, conjunction: str = "and") -> str:
    """`["a", "b", "c"]` -> `a, b and c` (or `a, b, and c` when `rng` picks the serial comma)."""
    items = list(items)
    if not items:
        return ""
    if len(items) == 1:
        return items[0]
    if len(items) == 2:
        return f"{items[0]} {conjunction} {items[1]}"
    serial = "," if rng is not None and rng.random() < 0.5 else ""
    return f"{', '.join(items[:-1])}{serial} {conjunction} {items[-1]}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table; numbers are written with `number`."""

    def cell(value: object) -> str:
        return number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def bullets(lines: Sequence[str]) -> str:
    return "\n".join(f"- {line}" for line in lines)


def capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def decapitalize(text: str) -> str:
    """ "The board of Helix" -> "the board of Helix"; names stay as they are."""
    first = text.split(" ", 1)[0]
    return text[:1].lower() + text[1:] if first in ("A", "An", "The") else text


def plural(count: float, singular: str, plural_form: str | None = None) -> str:
    return singular if count == 1 else (plural_form or f"{singular}s")


def amount(value: float, unit: tuple[str, str]) -> str:
    """`amount(1, ("unit", "units"))` -> `1 unit`; solver values are rounded to 4 decimals first."""
    value = round(float(value), 4)
    return f"{number(value)} {unit[0] if value == 1 else unit[1]}"


# Optional first lines that frame a statement without adding information.
FRAMINGS = (
    "Consider the following planning problem.",
    "You are advising on the decision below.",
    "The following situation comes from a real planning meeting.",
    "Here is an operations problem to solve.",
    "Read the situation carefully; not every detail matters.",
    "An analyst was handed this problem:",
    "Case:",
    "Background:",
    "Scenario:",
    "A planning question from practice:",
    "The situation is as follows.",
    "Context:",
    "Here are the facts of the case.",
    "This comes from a client engagement.",
    "Situation:",
    "Below is a decision problem.",
)
# Ways of setting the question apart at the end.
QUESTION_LEADS = (
    "",
    "",
    "",
    "Question: ",
    "Task: ",
    "Your job: ",
    "The question: ",
    "Goal: ",
    "To decide: ",
    "Asked: ",
)


@dataclass
class Statement:
    """A problem statement assembled from paragraphs, with distractors inserted among them.

    The opening paragraph stays first and the question last; distractor facts go to random
    positions in between (or are appended to a random paragraph), so a model cannot learn that
    irrelevant facts always sit in one place. Some statements open with a framing line and set
    the question apart with a lead word.
    """

    rng: random.Random
    paragraphs: list[str] = field(default_factory=list)
    question: str = ""

    def __post_init__(self) -> None:
        self._framing = pick(self.rng, FRAMINGS) if self.rng.random() < 0.3 else ""
        self._lead = pick(self.rng, QUESTION_LEADS)

    def add(self, text: str) -> None:
        if text.strip():
            self.paragraphs.append(text.strip())

    def distract(self, facts: Sequence[str], low: int = 0, high: int = 2) -> None:
        """Insert some of `facts`; facts about a company are left out when the opening
        describes a public body or a household (a zoo is not "founded" as a firm)."""
        if names_non_company([*self.paragraphs, *facts]):
            facts = [fact for fact in facts if not COMPANY_FACT.search(fact)]
        story = " ".join(self.paragraphs)
        facts = [fact for fact in facts if not setting_clash(fact, story)]
        count = min(len(facts), self.rng.randint(low, high))
        for fact in self.rng.sample(list(facts), count):
            if len(self.paragraphs) > 1 and self.rng.random() < 0.5:
                target = self.rng.randrange(1, len(self.paragraphs))
                if "\n" not in self.paragraphs[target]:  # never inside a table or a list
                    self.paragraphs[target] = f"{self.paragraphs[target]} {fact}"
                    continue
            self.paragraphs.insert(self.rng.randint(1, max(1, len(self.paragraphs))), fact)

    def text(self) -> str:
        question = self.question.strip()
        if question and self._lead:
            question = self._lead + question
        opening = [self._framing] if self._framing else []
        return agree("\n\n".join([*opening, *self.paragraphs, question]).strip())


def present(
    rng: random.Random,
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    sentence: Callable[[Sequence[object]], str],
    *,
    intro: Sequence[str],
    allowed: Sequence[str] = PRESENTATIONS,
) -> str:
    """One block of per-entity data, as a table, a bullet list or sentences (chosen by `rng`).

    `sentence(row)` writes one entity's data as a clause; `intro` are alternative lead-ins
    ("The plants can supply:") used before tables and lists.
    """
    style = pick(rng, list(allowed))
    if style == "table":
        return f"{pick(rng, intro)}\n\n{table(headers, rows)}"
    if style == "list":
        return f"{pick(rng, intro)}\n{bullets([capitalize(sentence(row)) for row in rows])}"
    sentences = [capitalize(sentence(row)) + "." for row in rows]
    return " ".join(sentences)


# Settings that are not companies, and filler that only fits a company.
NON_COMPANY = re.compile(
    r"\b(?:county|city council|municipal|fire department|zoo|hospital|school district|university|household|charity|ministry|"
    r"public health|family|animal shelter|city's|the city|police|campus|port authority|health authority|ambulance service|"
    r"council|volunteer|nonprofit|foundation|library|museum|park service|parish|farm|retiree|student|hiker|expedition|mission|safety board|authority|emergency|agency|broadband program|fire station|ambulance)\b",
    re.I,
)
# Filler that names one kind of setting: kept only where the rest of the text names that setting
# too ("The shelter houses about 60 animals." does not fit a pet-food company; "200 patients a day"
# does not fit a school cafeteria). Each entry: the filler's clue, the words that make it fit.
SETTING_CLUES = (
    (re.compile(r"\b[Tt]he shelter\b"), re.compile(r"\bshelters?\b", re.I)),
    (re.compile(r"\bpatients?\b", re.I), re.compile(r"\b(?:hospital|clinic|ward|dietitian|care home)s?\b", re.I)),
    (re.compile(r"\bpupils?\b|\bstudents\b", re.I), re.compile(r"\b(?:school|campus|university|college)s?\b", re.I)),
    (re.compile(r"\b[Tt]he zoo\b"), re.compile(r"\bzoos?\b", re.I)),
    (re.compile(r"\b[Tt]he hospital\b"), re.compile(r"\bhospitals?\b", re.I)),
    (re.compile(r"\b[Tt]he school\b"), re.compile(r"\bschools?\b", re.I)),
)


def setting_clash(sentence: str, rest: str) -> bool:
    """Whether `sentence` names a setting (`SETTING_CLUES`) that neither `rest`, the text around it,
    nor the sentence itself (the clue taken out) does."""
    return any(
        clue.search(sentence) and not fits.search(rest) and not fits.search(clue.sub(" ", sentence))
        for clue, fits in SETTING_CLUES
    )


def names_non_company(texts: Sequence[str]) -> bool:
    """Whether a public body, household or charity is described anywhere in `texts` (company filler
    sentences left out): then company filler contradicts the story, wherever the story says so."""
    return any(
        NON_COMPANY.search(sentence)
        for text in texts
        for sentence in re.split(r"(?<=[.!?])\s+", text)
        if not COMPANY_FACT.search(sentence)
    )


COMPANY_FACT = re.compile(r"\b(?:company|firm|head office|revenue|logo|customer|second office)\b", re.I)

# Facts that are true of a business and irrelevant to any model built here.
GENERIC_DISTRACTORS = (
    "The company was founded in {year}.",
    "The company's head office employs {staff} people, none of whom are involved in this decision.",
    "Last year the firm's revenue grew by {growth}%.",
    "The management team meets every {weekday} to review operations.",
    "The company's logo was redesigned in {year}.",
    "An external audit is scheduled for next {month}.",
    "The planning team uses spreadsheets for most of its reporting.",
    "Customer satisfaction surveys show a score of {score} out of 10.",
    "The firm is considering opening a second office in {city} next year.",
    "The current planning period is the {ordinal} one of the fiscal year.",
)

_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
_MONTHS = ("January", "March", "April", "June", "September", "October", "November")
_CITIES = ("Lyon", "Austin", "Osaka", "Porto", "Leeds", "Denver", "Turin", "Busan", "Tampere")
_ORDINALS = ("first", "second", "third", "fourth")


def generic_distractors(rng: random.Random, count: int = 3) -> list[str]:
    """`count` filled-in generic distractor facts."""
    values = {
        "year": rng.randint(1962, 2019),
        "staff": rng.randint(12, 480),
        "growth": rng.randint(2, 19),
        "weekday": pick(rng, _WEEKDAYS),
        "month": pick(rng, _MONTHS),
        "score": rng.choice(("7.4", "8.1", "8.6", "7.9")),
        "city": pick(rng, _CITIES),
        "ordinal": pick(rng, _ORDINALS),
    }
    return [template.format(**values) for template in rng.sample(GENERIC_DISTRACTORS, count)]
