"""Agreement-correct English for generated text: counts with nouns, articles, verbs that agree.

Statements and answers name things the generator drew at random (product names, units, money
words), so a template cannot hard-code "costs" or "a": "Eggs cost", "an analyzer", "1 dollar".
These helpers decide number and article from the words themselves, with the `inflect` library
(plural/singular forms, indefinite articles) and a short list of mass nouns it cannot know.

    is_plural("eggs") -> True       verb("eggs", "costs") -> "cost"
    article("analyzer") -> "an analyzer"
    count(1, "dollar") -> "1 dollar"  count(2.5, "dollar") -> "2.5 dollars"
"""

from __future__ import annotations

import functools
import re

from trex.workloads.or_data.inflect_engine import inflect

_ENGINE = inflect.engine()
# Words inflect reads as plurals that name one thing (or a mass) in these problems.
_SINGULAR_WORDS = frozenset(
    {
        "glass",
        "gas",
        "news",
        "series",
        "species",
        "bus",
        "canvas",
        "chassis",
        "analysis",
        "lens",
        "plus",
        "class",
        "process",
        "status",
        "campus",
        "asparagus",
        "hummus",
        "citrus",
        "bonus",
        "molasses",
        "oats",
        "hops",
        "wales",
        "athens",
        "paris",
        "brussels",
        "marseilles",
    }
)
# Words inflect reads as singular that are plural (or used as such) here.
_PLURAL_WORDS = frozenset({"people", "staff", "police", "cattle", "data", "media", "criteria"})


# Proper names the generators use (places, people, sites): one thing each, whatever their ending
# ("Leeds serves", "Wales needs"). Filled by `register_names` from the families' name pools.
PROPER_NAMES: set[str] = set()


def register_names(names) -> None:
    PROPER_NAMES.update(name for name in names if name[:1].isupper())
    is_plural.cache_clear()


@functools.lru_cache(maxsize=4096)
def is_plural(phrase: str) -> bool:
    """Whether a noun phrase is grammatically plural: its last alphabetic word decides
    ("sourdough loaves" yes, "solvent A" no, "corn" no, "eggs" yes, the name "Leeds" no)."""
    if phrase in PROPER_NAMES:
        return False
    words = re.findall(r"[A-Za-z]+", phrase)
    if not words:
        return False
    head = words[-1]
    low = head.lower()
    if len(head) <= 3 and head.isupper():  # "solvent A", "IPA", "model X"
        return False
    if low in _SINGULAR_WORDS:
        return False
    if low in _PLURAL_WORDS:
        return True
    return bool(_ENGINE.singular_noun(low)) and low.endswith("s")


def verb(subject: str, singular_form: str) -> str:
    """The form of a present-tense verb that agrees with `subject` ("costs" -> "cost" after
    a plural subject). `singular_form` is the third-person singular ("has", "costs", "is")."""
    if not is_plural(subject):
        return singular_form
    special = {"has": "have", "is": "are", "was": "were", "does": "do"}
    if singular_form in special:
        return special[singular_form]
    return _ENGINE.plural_verb(singular_form)


def sv(subject: str, singular_form: str) -> str:
    """`subject verb`, agreeing: sv("eggs", "costs") -> "eggs cost"."""
    return f"{subject} {verb(subject, singular_form)}"


def article(phrase: str) -> str:
    """The phrase with "a" or "an" ("an analyzer", "a unit", "an hour")."""
    return _ENGINE.a(phrase)


def plural_noun(singular: str) -> str:
    return _ENGINE.plural_noun(singular)


def singular_noun(plural: str) -> str:
    found = _ENGINE.singular_noun(plural)
    return found if found else plural


def number(value: float) -> str:
    """`1200` -> `1,200`, `12.5` -> `12.5`, `0.125` -> `0.125` (up to 4 decimals)."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.4f}".rstrip("0").rstrip(".")


def count(value: float, singular: str, plural: str | None = None) -> str:
    """A number with its noun in the right number: exactly 1 takes the singular, anything else
    (fractions, 0) the plural."""
    value = round(float(value), 4)
    noun = singular if value == 1 else (plural or plural_noun(singular))
    return f"{number(value)} {noun}"


def ordinal(value: int) -> str:
    return _ENGINE.ordinal(value)


# The agreement pass: what a template cannot know until the words are drawn.
_ARTICLE = re.compile(r"(?:(?<=^)|(?<=[\s(\"']))([Aa]n?) ([a-z][a-z-]*)")
_ONE = re.compile(r"(?<![\w.,-])1 ([a-z]+s)\b")
_NAME_BEFORE = re.compile(r"[A-Z][\w-]* $")
SINGULAR_VERBS = (
    "costs",
    "yields",
    "brings",
    "enters",
    "has",
    "is",
    "needs",
    "requires",
    "uses",
    "earns",
    "takes",
    "provides",
    "contains",
    "returns",
    "sells",
    "weighs",
    "gives",
    "was",
    "generates",
    "carries",
    "reaches",
    "serves",
)
SUBJECT_VERB = re.compile(
    r"(?:^|(?<=[.!?:]\s)|(?<=\n)|(?<=\n- ))([A-Z][a-z]+(?: [a-z]+){0,2}) (" + "|".join(SINGULAR_VERBS) + r")\b", re.M
)
NOT_SUBJECT = frozenset(
    {
        "This",
        "It",
        "Each",
        "Every",
        "What",
        "There",
        "That",
        "The",
        "No",
        "One",
        "So",
        "Thus",
        "Its",
        "His",
        "Hers",
        "Yes",
        "Less",
        "Plus",
        "Across",
        "Always",
        "Perhaps",
        "As",
        "Was",
        "Is",
        "Has",
        "Whichever",
        "Production",
        "Demand",
        "Nothing",
        "Everything",
        "Everyone",
        "Total",
        "Whoever",
        "Only",
        "Which",
        "Who",
        "Overtime",
    }
)
FUNCTION_WORDS = frozenset(
    {"this", "is", "was", "has", "its", "his", "us", "thus", "plus", "as", "less", "across", "always", "perhaps", "yes"}
)
_PRONOUN = re.compile(r"\b([Tt]hey|[Ww]e|[Yy]ou) (has|does|is|was)\b")


def plural_subject(subject: str) -> bool:
    """Whether a sentence-opening phrase is a plural noun phrase (function words, gerunds and
    the like are not subjects here)."""
    words = subject.split()
    if words[0] in NOT_SUBJECT or words[0].lower().endswith("ing") or any(word in FUNCTION_WORDS for word in words[1:]):
        return False
    return is_plural(subject)


def agree(text: str) -> str:
    """`text` with articles, "1 + noun" and sentence subjects made to agree (see the module
    docstring); everything else is left as it is."""

    def fix_article(match: re.Match) -> str:
        word = match.group(2)
        before = match.string[: match.start()].rstrip()
        if match.group(1)[0] == "A" and before and before[-1] not in ".!?:\n\"'(":
            return match.group(0)  # "Terminal A and ...": a capital A inside a sentence is a name, not an article
        wanted = article(word).split(" ", 1)[0]
        if wanted.lower() == match.group(1).lower():
            return match.group(0)
        return (wanted.capitalize() if match.group(1)[0].isupper() else wanted) + " " + word

    def fix_one(match: re.Match) -> str:
        word = match.group(1)
        if word in FUNCTION_WORDS or not is_plural(word) or _NAME_BEFORE.search(match.string[: match.start()]):
            return match.group(0)  # "Plant 1 needs": the 1 is part of a name
        return f"1 {singular_noun(word)}"

    def fix_verb(match: re.Match) -> str:
        subject, form = match.groups()
        if not plural_subject(subject):
            return match.group(0)
        return f"{subject} {verb(subject, form)}"

    text = _ARTICLE.sub(fix_article, text)
    text = _ONE.sub(fix_one, text)
    text = SUBJECT_VERB.sub(fix_verb, text)
    plural_forms = {"has": "have", "does": "do", "is": "are", "was": "were"}
    return _PRONOUN.sub(lambda match: f"{match.group(1)} {plural_forms[match.group(2)]}", text)
