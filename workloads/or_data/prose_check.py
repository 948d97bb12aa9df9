"""The prose checker: rules that catch generated text a careful reader would stop at.

`check_prose(text)` returns the flags of one text (a prompt, an answer, a CPT document); the
pipeline rejects a sample with any flag and counts the flags by kind (`trex data stats`). Code
blocks, LP files and LaTeX are set aside first: `x_p` in a formula is notation, in a sentence
it is a leak.

| kind | what it catches |
| --- | --- |
| index_leak | an index letter in a sentence ("devices of product p", "taken by driver w") |
| raw_fill | a variable description pasted into a sentence ("the 1 if project i is chosen"), an empty fill ("rules: .") or a leftover `{placeholder}` |
| agreement | plural subject with a singular verb ("Eggs costs", "Nickel pellets cost ... and provides"), "they has", "a analyzer" (also after a list dash), "1 dollars", "Because of their size, Highbury must" |
| duplicated_opener | two framing lines stacked ("Background:" then "Here is a planning problem:") |
| contradicting_filler | company filler in a public or household setting ("The company was founded ..." about a zoo or a fire department) |
| float_artefact | binary floating-point noise (`0.6599999999999999`) anywhere, code included |
| number_format | a written-out sum or row a reader cannot check: an element named by a bare number ("Machine for 0:", "1 (2)", "30 (microbiome set, 13)", "the most slack is 16 with 1 to spare"), a row whose limit is 0 or negative because terms were moved to the left ("= −45, 45 below the cap of 0"), "≈" on a sum of whole numbers, terms lumped into "(from 7 nonzero ... terms)" |
| missing_table | "(table below)" with no table after it |
| stacked_parentheses | two parentheses in a row or one inside another ("at its limit of 8 (makespan) (binding)", "(the penalty per hour the order waits (customer priority))") |
| seam | a sentence glued from parts that do not read as one: a plural frame around one element ("The sources are Router C (110 Gbps);"), a capital after a colon inside a sentence ("depend on the CNC machine: A dash means"), a list left empty ("(where it has one): "), "195 thousand (GBP)", "dayly", a doubled noun ("the RNA batch sample batch"), a unit said twice ("Hours needed (hours)"), "pieces of type bar piece A", "Its head office" after another subject, "The Mon-Fri costs", "an upper bound from first-fit decreasing" |
| mechanical_reading | an LP file read back as counts ("its constraints come in the families no rows", "declared General/Binary", "over 30 variables in the families") |
| check_rows | "Checking the plan" rows that do not hold it: a "tightest rows" list where no row binds, a switched-off big-M row ("23 × 0 (arc, ...) − 10 = 13") called binding, the loosest row shown where none binds, "a row with slack is not met exactly", binding rows hidden behind "..." |

`contradicting_filler` also catches filler that names another setting than the story's
(`phrasing.SETTING_CLUES`: "The shelter houses about 60 animals." in a pet-food company's story),
and company filler wherever the text describes a public body or a charity. `raw_fill` also
catches a general description pasted next to an element ("the variable for milk (servings of each
ingredient to use)", "the tons of each product to make per month for solvent A").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from trex.workloads.or_data.phrasing import FRAMINGS, names_non_company, setting_clash
from trex.workloads.or_data.prose import FUNCTION_WORDS, SUBJECT_VERB, is_plural, plural_subject

KINDS = (
    "index_leak",
    "raw_fill",
    "agreement",
    "duplicated_opener",
    "contradicting_filler",
    "float_artefact",
    "number_format",
    "missing_table",
    "stacked_parentheses",
    "seam",
    "mechanical_reading",
    "check_rows",
)


@dataclass(frozen=True)
class Flag:
    kind: str
    excerpt: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.excerpt!r}"


_FENCE = re.compile(r"```.*?```", re.S)
_DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
_INLINE_MATH = re.compile(r"\$[^$\n]*\$")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_TABLE_LINE = re.compile(r"^\s*\|.*$", re.M)
_HEADING = re.compile(r"^#+ .*$", re.M)

_FLOAT_NOISE = re.compile(r"\d\.\d*?(?:0{6,}|9{6,})[1-9]\d*")
# A lone lowercase letter used as a word: not "a", not inside "e.g."/"i.e.", not a unit after a number.
_LONE_LETTER = re.compile(r"(?<![\w'’.\\/-])([b-hj-z])(?![\w'’/-])(?!\.\w)")
_UNIT_LETTERS = {"g", "m", "h", "t", "l", "s", "k"}
_RAW_FILL = (
    re.compile(r"\b(?:the|a|an|The|A|An)\s+1 (?:if|when)\b"),
    re.compile(r":\s*\.(?:\s|$)"),
    re.compile(r"(?<!= )\{[a-z_]+\}"),
    re.compile(r"\bthe the\b", re.I),
)
# A general description ("... of each ingredient ...") pasted next to the element it was meant to
# name: in parentheses after "for <element>", or followed by "for <Element>".
_PASTED = (
    re.compile(r"\bfor [^()\n]{1,40}? \([^()\n]*\beach [a-z]+[^()\n]*\)"),
    re.compile(r"\beach [a-z]+\b[^.;:()\n]{0,40}? for [A-Z]"),
    re.compile(
        r"\beach [a-z]+\b[^.;:()\n]{0,30}?\bto [a-z]+\b[^.;:()\n]{0,30}? for [a-z]"
    ),  # "... to make per month for solvent A"
)
_NUMBER_FORMAT = (
    re.compile(r"(?m)(?:^|- |\. )[A-Z][\w -]{0,40}? for \d+:(?!\d)"),  # "Machine for 0:", not "for 08:00"
    re.compile(r"\d \((?:[^()\n]*, )?\d+\)"),  # "1 (2)", "30 (microbiome set, 13)"
    re.compile(r"\bis \d+ with [\d.,]+ to spare"),  # "the most slack is 16 with 1 to spare"
    re.compile(r"\b(?:cap|minimum|limit)(?: of)? (?:0(?![.,]?\d)(?! \((?!binding\)))|−\d)"),  # limit 0 or below
    re.compile(r"\(from \d+ nonzero [\w ]+? terms?\)"),  # lumped terms
)
_STACKED = (
    re.compile(r"\([^()\n]*[A-Za-z][^()\n]*\) \("),  # "(makespan) (binding)"; not "(−2) (flow balance ...)"
    re.compile(r"\([^()\n]*\((?![a-z0-9]{1,3}\))[^()\n]*\)[^()\n]*\)"),  # one inside another; "(see (b))" is fine
    re.compile(r"\(\("),  # a list of pairs inside a parenthesis
)
_SEAMS = (
    re.compile(r"\bThe (?:sources|destinations) are [^;,.()]+ \([^()]*\)[;.]"),  # plural frame, one element
    re.compile(r"\brequire [A-Z][^;,.()]+ \([^()]*\)\."),
    re.compile(r"[a-z]: (?:A|An|The) [a-z]+ (?:means|marks)\b"),
    re.compile(r"\(where it has one\): *(?:\n|$)"),
    re.compile(r"\b(?:thousand|million) \([A-Z]{3}\)"),
    re.compile(r"\bdayly\b"),
    # the Sixth review's seams
    re.compile(r"\b([A-Za-z]+)\b(?: [a-z]+){0,3} \((?i:\1)\)"),  # "Hours needed (hours)": the unit said twice
    re.compile(r"\b(\w+?)s? of type (?:\w+ ){0,2}\1\b"),  # "pieces of type bar piece A"
    re.compile(r"\bIts head office\b"),  # "its" = whatever the sentence before was about
    re.compile(
        r"\b[Tt]he (?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)-(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\b(?! (?:rota|shift|pattern|week))"
    ),  # "The Mon-Fri costs 1,175 yuan": the noun is missing
    re.compile(r"\ban upper bound from first-fit decreasing\b"),  # the set holds FFD's count plus spares
    re.compile(r"\((?:[\w ]+ )?listed\)[ \t]*(?:\n|$)"),  # "(patterns listed)" and the line ends: nothing is
    # the Seventh review's seams
    re.compile(r"\b\d[\d,.]* ([a-z]+) of \1\b"),  # "Only 15 engineers of engineers are available"
    re.compile(
        r"\b[A-Z][\w-]*(?: [A-Z][\w-]*)* and [A-Z][\w-]*(?: [A-Z][\w-]*)* and [A-Z][\w-]*(?: [A-Z][\w-]*)* and [A-Z]"
    ),
    # ^ "Lindenhof and Corner Cup and Bean Street and Café Rosa": two pairs run together
    re.compile(r"\bhas (?:limited time|only so many hours), so the number of\b"),  # a count justified by time
)
# The Seventh review's patterns by the kind they raise, as raw expressions (compiled below):
# - contradicting_filler: words of one setting in another (its 10 cases): shipping for sites that
#   serve people or data, "money, time or space" for whatever the limits are, goods for data traffic;
# - raw_fill: a "whether" clause running on over the next decision ("whether a lorry drives ... and
#   the bottles delivered"), a general noun with its elements pasted after it ("to put into each
#   option for corporate bonds"), the kind and elements of a decision run into its value ("flow,
#   Yard 2, Hub Central 35 → 52").
# Each pattern comes with a word it cannot match without: the expressions run on every prompt and
# answer, and a plain substring test first keeps them off the texts they cannot concern.
_SEVENTH_PATTERNS = {
    "contradicting_filler": [
        ("ship", r"\b(?:data centers?|charging hubs?|clinics?|hospitals?|schools?)\b[^.;\n]{0,30}\bship(?:s|ped)?\b"),
        ("money, time", r"\b(?:whether )?money, time or space\b"),
        ("goods are", r"\bgoods are neither created nor lost\b(?=[\s\S]*\b(?:Gbps|Mbit|data traffic)\b)"),
    ],
    "raw_fill": [
        ("whether", r"\b(?:are|is|determine|decide|settle|has to determine) whether [^.;:\n]{5,140}? and the [a-z]"),
        ("fixed proportion", r"\beach [a-z]+ for [^.;:()\n]{1,80}? together \(in a fixed proportion\)"),
        (" → ", r"(?:: |; )[a-z]+, [^;:()\n→]+ −?\d[\d,.]* → −?\d"),
    ],
    # said under every MIP, true under none in particular (the Seventh review's #19, #24, #45, #48)
    "check_rows": [
        ("moves in steps", r"\boptimum moves in steps: loosening a binding row helps only when\b"),
        # symmetry-breaking rows read as limits of the plan (#24: "Symmetry: 2 of 3 rows binding"): they
        # only order interchangeable bins, so they never say why the count is least
        ("Symmetry", r"(?m)^- Symmetry(?: for [^:\n]+)?: (?:\d+ of \d+ rows binding|binding|[\d,.]+ of slack left)"),
    ],
}
_SEVENTH = {
    kind: [(needle, re.compile(pattern)) for needle, pattern in patterns]
    for kind, patterns in _SEVENTH_PATTERNS.items()
}
# one lane named as two places ("1 of 6 rows binding (Data Center North and Core Router A)"), in a text
# that writes its lanes as arrows; a pair of jobs ("(pistons and brackets)") is a pair, not a lane
_LANE_AS_PAIR = re.compile(r"\b1 of \d+ rows binding \([^()\n,]* and [^()\n,]*\)")
_PLURAL_SEAMS = (
    re.compile(r"\bhow ([a-z]+) (?:flows|moves|travels)\b"),  # "how containers flows"
    re.compile(r"\b([a-z]+) is at least a share\b"),  # "shirts is at least a share"
)
_EMPTY_HEADING = re.compile(r"\*\*Constraints\*\*[ \t]*\n(?:[ \t]*\n)*(?:[ \t]*(?:$|```|#|\*\*)|$)")
# "Nickel pellets cost ... and provides": the second verb of a plural subject left singular.
_SECOND_VERB = re.compile(
    r"(?:^|(?<=[.!?:]\s)|(?<=\n)|(?<=\n- ))([A-Z][a-z]+(?: [a-z]+){0,2}) (?:cost|have|contain|provide|give)\b"
    r"[^.;\n]{0,60}? and (?:provides|has|contains|costs|gives)\b",
    re.M,
)
# "Because of their size, Highbury must be covered": "their" before one name.
_THEIR_ONE = re.compile(r"\bBecause of their \w+, [A-Z][\w-]*(?: [A-Z][\w-]*)* (?:must|needs|is|has)\b")
_DOUBLED_NOUN = re.compile(r"\b([a-z]{3,}) ([a-z]{3,}) \1\b")  # "batch sample batch"; function words are let through
_NOT_NOUNS = {
    *[
        "per",
        "the",
        "and",
        "for",
        "from",
        "with",
        "than",
        "one",
        "each",
        "that",
        "all",
        "not",
        "its",
        "are",
        "was",
        "has",
        "but",
        "can",
        "any",
        "into",
        "over",
        "then",
    ],
    *["time", "step", "side", "after"],
    *["there", "since"],  # "is there since there is only a limited budget" (seed 2461 #132) is not a doubled noun
}
_MECHANICAL = (
    re.compile(r"\bcome in the families no rows\b"),
    re.compile(r"\bdeclared General/Binary\b"),
    re.compile(r"\bover \d+ variables? in the families\b"),
)
# "What limits the plan": a row with room is not a row that fails; no binding row hidden behind "...";
# where no short row binds, the loosest row says the least (the closest one is shown).
_CHECK_WORDING = (
    re.compile(r"\bwith slack (?:is|are) not met exactly\b"),
    re.compile(r"\brows? binding \([^()\n]*, \.\.\.\)"),
    re.compile(r"(?:is at its limit here|binds at this plan)[^\n:]*; the one with the most room"),
)
_CHECK_HEADINGS = re.compile(
    r"(?:The rows that hold the plan, written out|Checking the tightest rows by hand|What the plan uses of its limits)"
    r"[^\n]*:\n\n((?:- [^\n]*\n?)+)"
)
_BINDS = re.compile(r"\bbind(?:s|ing)\b|exactly the limit|equal to its limit|at its limit")
_SWITCHED_OFF = re.compile(r"\d × 0 \([^()\n]*\) [−+] [\d,.]+ = ")
_APPROX_LINE = re.compile(r"[^\n]*≈ −?[\d,]+(?:\.\d+)?")
_TABLE_BELOW = "(table below)"
_TABLE_HEADER = re.compile(r"^\s*\|.*\|\s*\n\s*\|\s*-", re.M)

# "they lacks" (the tenth session's review, #2): the verbs the stories' reasons start with, beside the auxiliaries
_BAD_PRONOUN_VERB = re.compile(
    r"\b(?:they|we|you) (?:has|is|was|does|lacks|needs|holds|reads|takes|works|wants)\b"
    r"|\b(?:he|she|it) (?:have|are|were)\b",
    re.I,
)
_A_BEFORE_VOWEL = re.compile(r"\b[aA] ([aeiouAEIOU][a-z]+)")
_AN_BEFORE_CONSONANT = re.compile(r"\b[aA]n ([b-df-hj-np-tv-z][a-z]+)")
_ONE_PLURAL = re.compile(r"(?<![\d.,-])\b1 ([a-z]+s)\b")
_CONSONANT_SOUND_VOWELS = ("uni", "use", "usu", "one", "once", "eu", "ufo", "uti", "ure", "uro")
_VOWEL_SOUND_CONSONANTS = ("hour", "honest", "honor", "honour", "heir")
# Filler sentences that only fit a company (the generic distractors of `phrasing`).
COMPANY_FILLER = re.compile(r"\b(?:The company|the company's|The firm|the firm's|Its head office|The company's)\b")
_OPENERS = (
    *FRAMINGS,
    "Here is a planning problem:",
    "Consider this problem:",
    "Problem:",
    "Problem description:",
    "Here is the base case:",
    "Help me decide.",
)


NOT_PROSE = (_FENCE, _DISPLAY_MATH, _INLINE_MATH, _INLINE_CODE, _TABLE_LINE, _HEADING)  # in the order removed


def prose_only(text: str) -> str:
    """The sentences of a markdown text: code, LP, LaTeX, tables and headings removed."""
    for pattern in NOT_PROSE:
        text = pattern.sub(" ", text)
    return text


def check_prose(text: str) -> list[Flag]:
    """Every flag the rules raise on `text` (see the module docstring)."""
    flags: list[Flag] = []
    for match in _FLOAT_NOISE.finditer(text):
        flags.append(Flag("float_artefact", match.group(0)))
    prose = prose_only(text)
    for match in _LONE_LETTER.finditer(prose):
        letter = match.group(1)
        before = prose[max(0, match.start() - 12) : match.start()]
        after = prose[match.end() : match.end() + 3]
        if letter in _UNIT_LETTERS and re.search(r"\d\s*$", before):
            continue
        if after.startswith(")") and before.endswith("("):  # "(b)" enumerations
            continue
        flags.append(Flag("index_leak", prose[max(0, match.start() - 30) : match.end() + 10].strip()))
    for pattern in _RAW_FILL:
        for match in pattern.finditer(prose):
            flags.append(Flag("raw_fill", prose[max(0, match.start() - 30) : match.end() + 20].strip()))
    for pattern in _PASTED:
        for match in pattern.finditer(prose):
            flags.append(Flag("raw_fill", match.group(0)[:90]))
    flags += _agreement(prose)
    flags += _openers(text)
    sentences = [part for part in re.split(r"(?<=[.!?])\s+|\n+", prose) if part.strip()]  # list lines are sentences
    if names_non_company(sentences):
        for sentence in sentences:
            if COMPANY_FILLER.search(sentence):
                flags.append(Flag("contradicting_filler", sentence.strip()[:80]))
    for index, sentence in enumerate(sentences):
        if setting_clash(sentence, " ".join(sentences[:index] + sentences[index + 1 :])):
            flags.append(Flag("contradicting_filler", sentence.strip()[:80]))
    flags += _number_format(prose)
    flags += _missing_tables(text)
    for kind, patterns, where in (
        ("stacked_parentheses", _STACKED, prose),
        ("seam", _SEAMS, prose),
        ("mechanical_reading", _MECHANICAL, prose),
    ):
        for pattern in patterns:
            for match in pattern.finditer(where):
                flags.append(Flag(kind, where[max(0, match.start() - 30) : match.end() + 10].strip()))
    for match in _DOUBLED_NOUN.finditer(prose):
        if match.group(1) not in FUNCTION_WORDS | _NOT_NOUNS and match.group(2) not in FUNCTION_WORDS | _NOT_NOUNS:
            flags.append(Flag("seam", prose[max(0, match.start() - 20) : match.end() + 10].strip()))
    flags += _check_rows(text)
    flags += _seventh_review(text, prose)
    return flags


def _seventh_review(text: str, prose: str) -> list[Flag]:
    """The Seventh review's text patterns: words of another setting, decisions run together, plural
    subjects with singular verbs in template slots, a false MIP claim, an empty heading and a line
    said twice."""
    flags = []
    for kind, patterns in _SEVENTH.items():
        for needle, pattern in patterns:
            if needle in prose:
                flags += [Flag(kind, match.group(0)[:90]) for match in pattern.finditer(prose)]
    for pattern in _PLURAL_SEAMS if ("how " in prose or "a share" in prose) else ():
        for match in pattern.finditer(prose):
            if is_plural(match.group(1)) and match.group(1) not in FUNCTION_WORDS:
                flags.append(Flag("agreement", match.group(0)))
    if "→" in prose:
        for match in _LANE_AS_PAIR.finditer(prose):
            flags.append(Flag("seam", match.group(0)[:90]))
    if "**Constraints**" in text and _EMPTY_HEADING.search(text):
        flags.append(Flag("seam", "a **Constraints** heading with nothing under it"))
    lines = Counter(line.strip() for line in prose.split("\n") if line.strip()[:1].isupper() and len(line.split()) >= 6)
    for line in sorted(line for line, count in lines.items() if count > 1):
        flags.append(Flag("duplicated_opener", "said twice: " + line[:70]))
    return flags


def _check_rows(text: str) -> list[Flag]:
    """A list under a "rows that hold the plan" heading needs a row at its limit, and a row called
    binding must not be a switched-off big-M row (a decision at 0 times the big-M, a constant moved)."""
    flags = []
    for match in _CHECK_HEADINGS.finditer(text):
        lines = match.group(1).strip().split("\n")
        if not any(_BINDS.search(line) for line in lines):
            flags.append(Flag("check_rows", "no row binds under: " + match.group(0).split("\n")[0][:60]))
    for pattern in _CHECK_WORDING:
        for match in pattern.finditer(text):
            flags.append(Flag("check_rows", match.group(0)[:90]))
    for line in text.split("\n"):
        if _BINDS.search(line) and _SWITCHED_OFF.search(line):
            flags.append(Flag("check_rows", line.strip()[:90]))
    return flags


def _number_format(prose: str) -> list[Flag]:
    flags = [
        Flag("number_format", match.group(0).strip()[:80])
        for pattern in _NUMBER_FORMAT
        for match in pattern.finditer(prose)
    ]
    for match in _APPROX_LINE.finditer(prose):
        if not re.search(r"\d\.\d", match.group(0)):  # only whole numbers: the sum is exact
            flags.append(Flag("number_format", "≈ on an exact sum: " + match.group(0).strip()[-60:]))
    return flags


def _missing_tables(text: str) -> list[Flag]:
    """Each "(table below)" needs its own table further down."""
    flags = []
    start = 0
    while (position := text.find(_TABLE_BELOW, start)) >= 0:
        tables_after = len(_TABLE_HEADER.findall(text, position))
        if tables_after < len(re.findall(re.escape(_TABLE_BELOW), text[position:])):
            line = text[text.rfind("\n", 0, position) + 1 : position + len(_TABLE_BELOW)]
            flags.append(Flag("missing_table", line.strip()[-80:]))
            break
        start = position + 1
    return flags


def _agreement(prose: str) -> list[Flag]:
    flags = []
    for match in _BAD_PRONOUN_VERB.finditer(prose):
        flags.append(Flag("agreement", match.group(0)))
    for match in _A_BEFORE_VOWEL.finditer(prose):
        if match.group(0)[0] == "A" and not _sentence_start(prose, match.start()):
            continue  # "machine A and ...": a name, not an article
        if not match.group(1).lower().startswith(_CONSONANT_SOUND_VOWELS):
            flags.append(Flag("agreement", match.group(0)))
    for match in _AN_BEFORE_CONSONANT.finditer(prose):
        if not match.group(1).lower().startswith(_VOWEL_SOUND_CONSONANTS):
            flags.append(Flag("agreement", match.group(0)))
    for match in _ONE_PLURAL.finditer(prose):
        word = match.group(1)
        if word not in FUNCTION_WORDS and is_plural(word) and not re.search(r"[A-Z][\w-]* $", prose[: match.start()]):
            flags.append(Flag("agreement", match.group(0)))
    for match in SUBJECT_VERB.finditer(prose):
        if plural_subject(match.group(1)):
            flags.append(Flag("agreement", match.group(0)))
    for match in _SECOND_VERB.finditer(prose):
        if plural_subject(match.group(1)):
            flags.append(Flag("agreement", match.group(0)[:80]))
    for match in _THEIR_ONE.finditer(prose):
        flags.append(Flag("agreement", match.group(0)))
    return flags


def _sentence_start(text: str, position: int) -> bool:
    before = text[:position].rstrip(" ")
    return not before.strip() or before[-1:] in ".!?:\n" or bool(re.search(r"(?:^|\n)\s*[-*]$", before))


def _openers(text: str) -> list[Flag]:
    paragraphs = [paragraph.strip() for paragraph in text.strip().split("\n\n")[:4]]
    found = [p for p in paragraphs if any(p.startswith(opener) and len(p) < len(opener) + 60 for opener in _OPENERS)]
    return [Flag("duplicated_opener", " / ".join(found))] if len(found) > 1 else []


def check_texts(texts: Iterable[str]) -> list[Flag]:
    flags: list[Flag] = []
    for text in texts:
        flags += check_prose(text)
    return flags


def summarize(flags: Iterable[Flag]) -> dict[str, int]:
    return dict(sorted(Counter(flag.kind for flag in flags).items()))
