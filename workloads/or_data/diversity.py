"""The diversity report of a run: does the data teach modelling, or one generator's templates?

Computed from the SFT records alone (`trex data stats` prints it), per family:

| measure | what it is |
| --- | --- |
| skeletons | distinct prompt skeletons: the prompt's first and last sentences with numbers and capitalized names masked (`skeleton`), and the largest share any one skeleton has |
| answer_overlap | masked 5-gram overlap: the share of an answer's distinct 5-grams (numbers and names masked) that also occur in another answer of the same family, averaged over answers; for the whole answer and for its prose alone (code, LP, LaTeX and tables set aside) |
| answer_parts | where the whole answer's 5-grams come from: for each part (prose, code, LP file, math: LaTeX, tables, inline code and headings), its share of the family's answer 5-grams and the share of those found in another answer (5-grams counted within a part, so the figure approximates the whole-answer one) |
| answer_parts_at | `answer_parts` with every family cut to 4 random answers (mean over draws) |
| answer_overlap_at | the same whole-answer overlap with every family cut to k random answers (k = 4, 15, 50; mean over draws): the measure grows with the number of answers it compares, so runs of different sizes (the issue's 40-sample reading had about 4 answers per family) are compared at equal k |
| repeated_sentences | the share of answer prose sentences that occur verbatim (masked) in another sample of the family |
| code_templates | distinct program templates: the program with its data block, strings and numbers masked |
| code_styles | distinct `code_style` variants found in the programs (library or import, model name, report) |
| code_libraries | distinct solver libraries the programs use (pyscipopt, PuLP, Pyomo, coptpy) |
| size | number of variables in the LP file: min, median, max, and the count per decade over all samples |

A template generator scores high overlap and few templates; an overlap of 0.25 means three
quarters of an answer's 5-grams are its own.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from trex.workloads.or_data.prose_check import NOT_PROSE, prose_only

_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_NAME = re.compile(r"\b[A-Z][\w&'-]*(?:\s+[A-Z0-9][\w&'-]*)*")
_WORD = re.compile(r"[a-z#@]+|[^\sa-z#@]")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def masked(text: str) -> str:
    """Numbers -> `#`, capitalized names -> `@` (names first, so "Plant 3" is one `@`)."""
    return _NUMBER.sub("#", _NAME.sub("@", text))


def words(text: str) -> list[str]:
    return _WORD.findall(masked(text).lower())


def grams(text: str, n: int = 5) -> set[tuple[str, ...]]:
    tokens = words(text)
    # the n shifted copies zipped: the same tuples as slicing at each position, made in C
    return set(zip(*(tokens[i:] for i in range(n))))


def skeleton(prompt: str) -> str:
    """The prompt's first and last sentences, masked: the frame a template gives a prompt."""
    sentences = [
        s.strip()
        for s in _SENTENCE.split(prompt.strip())
        if s.strip() and not s.strip().startswith(("|", "-", "```", "$"))
    ]
    if not sentences:
        return ""
    return masked(sentences[0]) + " ... " + masked(sentences[-1])


_GRAM_IDS: dict[tuple[str, ...], int] = {}


@functools.lru_cache(maxsize=16384)  # six texts per answer (`prepare`), for 2,730 answers
def _gram_set(text: str, n: int) -> frozenset[int]:
    """`grams` as distinct integers (one per distinct n-gram: counting them needs no tuple
    hashing), kept: `overlap_at` measures the same answers in many random draws."""
    ids = _GRAM_IDS
    found = grams(text, n)
    new = found.difference(ids)  # numbered in bulk, not by a setdefault call per gram
    ids.update(zip(new, range(len(ids), len(ids) + len(new))))
    return frozenset(map(ids.__getitem__, found))


@functools.lru_cache(maxsize=16384)
def _gram_array(text: str, n: int) -> np.ndarray:
    """`_gram_set` as an int64 array, kept: `overlap` counts the same texts in many draws."""
    found = _gram_set(text, n)
    return np.fromiter(found, dtype=np.int64, count=len(found))


def overlap(texts: Sequence[str], n: int = 5) -> float:
    """Mean share of a text's distinct n-grams found in at least one other text of `texts`.

    Counted in numpy: a text's grams are distinct, so a gram is in another text exactly when its
    id occurs twice in all the texts' ids together (next to an equal id once they are sorted).
    The per-text counts, and so the shares and their sum in text order, are those of counting
    each gram's texts one by one (which took most of the report's time after a run's last shard)."""
    arrays = [array for array in (_gram_array(text, n) for text in texts) if len(array)]
    if not arrays:
        return 0.0
    ids = np.concatenate(arrays)
    order = np.argsort(ids)
    ordered = ids[order]
    equal_next = ordered[1:] == ordered[:-1]
    repeated_sorted = np.zeros(len(ids), dtype=bool)
    repeated_sorted[1:] |= equal_next
    repeated_sorted[:-1] |= equal_next
    repeated = np.empty_like(repeated_sorted)
    repeated[order] = repeated_sorted
    lengths = [len(array) for array in arrays]
    found = np.add.reduceat(repeated.astype(np.int64), np.cumsum([0, *lengths[:-1]]))
    shares = [int(count) / length for count, length in zip(found, lengths, strict=True)]
    return round(sum(shares) / len(shares), 4)


OVERLAP_SIZES = (4, 15, 50)


def overlap_at(texts: Sequence[str], k: int, draws: int = 8, seed: int = 0) -> float | None:
    """`overlap` among `k` texts drawn at random from `texts` (mean over `draws` draws; all of
    them once when there are exactly `k`); None when there are fewer than `k`."""
    if len(texts) < k:
        return None
    rng = random.Random(seed)
    rounds = 1 if len(texts) == k else draws
    return round(sum(overlap(rng.sample(list(texts), k)) for _ in range(rounds)) / rounds, 4)


_PYTHON_FENCE = re.compile(r"```python\n.*?```", re.S)
_LP_FENCE = re.compile(r"```lp\n.*?```", re.S)
PARTS = ("prose", "code", "lp", "math")


def answer_parts(answer: str) -> dict[str, str]:
    """An answer split into `PARTS`: the programs, the LP files, the prose (`prose_only`), and the
    rest (LaTeX, tables, inline code, headings, other fenced blocks)."""
    code = "\n".join(_PYTHON_FENCE.findall(answer))
    lp = "\n".join(_LP_FENCE.findall(answer))
    rest = _LP_FENCE.sub(" ", _PYTHON_FENCE.sub(" ", answer))
    math = []
    for pattern in NOT_PROSE:  # in prose_only's order, each taken out before the next looks
        math += pattern.findall(rest)
        rest = pattern.sub(" ", rest)
    return {"prose": rest, "code": code, "lp": lp, "math": "\n".join(math)}


@functools.lru_cache(maxsize=4096)
def _part_grams(answer: str, n: int) -> dict[str, frozenset[int]]:
    """`_gram_set` of each of `answer_parts`, kept: `overlap_by_part` measures the same answers
    again in its random draws. Through `_gram_set`'s cache because the prose part is the text
    `prepare` already counted (`prose_only(answer)`: the same string on all 1,000 answers of a
    1,000-sample run), which is then not split into grams twice."""
    return {part: _gram_set(text, n) for part, text in answer_parts(answer).items()}


@functools.lru_cache(maxsize=4096)
def _prose(answer: str) -> str:
    return prose_only(answer)


def overlap_by_part(answers: Sequence[str], n: int = 5) -> dict[str, dict[str, float]]:
    """For each part of `answer_parts`: `grams`, its share of all the answers' distinct n-grams
    (pooled), and `shared`, the share of those that occur in another answer too."""
    split = [_part_grams(answer, n) for answer in answers]
    frequency: Counter = Counter()
    for parts in split:
        frequency.update(set().union(*parts.values()))
    totals = {part: sum(len(parts[part]) for parts in split) for part in PARTS}
    everything = sum(totals.values()) or 1
    report = {}
    repeated = {gram for gram, count in frequency.items() if count > 1}
    for part in PARTS:
        shared = sum(len(parts[part] & repeated) for parts in split)
        report[part] = {
            "grams": round(totals[part] / everything, 4),
            "shared": round(shared / totals[part], 4) if totals[part] else 0.0,
        }
    return report


def overlap_by_part_at(
    answers: Sequence[str], k: int, draws: int = 8, seed: int = 0
) -> dict[str, dict[str, float]] | None:
    """`overlap_by_part` among `k` answers drawn at random (mean over `draws` draws, as `overlap_at`);
    None when there are fewer than `k`."""
    if len(answers) < k:
        return None
    rng = random.Random(seed)
    rounds = 1 if len(answers) == k else draws
    reports = [overlap_by_part(rng.sample(list(answers), k)) for _ in range(rounds)]
    return {
        part: {key: round(sum(report[part][key] for report in reports) / rounds, 4) for key in ("grams", "shared")}
        for part in PARTS
    }


PARTS_AT = 4  # the family size of the 40-sample reading


@functools.lru_cache(maxsize=4096)
def _sentences(text: str) -> frozenset[str]:
    """The masked sentences of `text` that `repeated_sentences` counts (at least four words)."""
    return frozenset(masked(s.strip()) for s in _SENTENCE.split(text) if len(s.split()) >= 4)


def repeated_sentences(texts: Sequence[str]) -> float:
    """Share of sentences (masked) that occur in more than one of `texts`."""
    per_text = [_sentences(text) for text in texts]
    frequency: Counter = Counter()
    for sentences in per_text:
        frequency.update(sentences)
    total = sum(len(sentences) for sentences in per_text)
    repeated = sum(1 for sentences in per_text for sentence in sentences if frequency[sentence] > 1)
    return round(repeated / total, 4) if total else 0.0


_DATA_BLOCK = re.compile(r"# Data\n.*?\n\n", re.S)
_STRING = re.compile(r"f?\"[^\"\n]*\"|f?'[^'\n]*'")


def code_template(program: str) -> str:
    """A hash of the program with its data, strings and numbers masked."""
    body = _DATA_BLOCK.sub("# Data\n\n", program)
    body = _NUMBER.sub("#", _STRING.sub("S", body))
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:12]


def code_style_key(program: str) -> str:
    for library, marker in (("pulp", "import pulp"), ("pyomo", "import pyomo"), ("coptpy", "import coptpy")):
        if marker in program:
            imports = library
            break
    else:
        imports = "alias" if "import pyscipopt as scip" in program else "from"
    name = re.search(
        r"^(\w+) = (?:scip\.|pulp\.|pyo\.|cp\.Envr\(\)\.)?(?:Model|LpProblem|ConcreteModel|createModel)\(",
        program,
        re.M,
    )
    report = "helper" if "def show(" in program else "dict" if "solution = {}" in program else "inline"
    data = "/rows" if re.search(r"^\w+_rows = \{", program, re.M) else ""
    data = "/records" if re.search(r"^\w+_records = \[", program, re.M) else data
    return f"{imports}/{name.group(1) if name else '?'}/{report}{data}"


_LP_KEYWORDS = {
    "maximize",
    "minimize",
    "subject",
    "to",
    "bounds",
    "general",
    "generals",
    "binary",
    "binaries",
    "end",
    "free",
    "inf",
    "infinity",
    "st",
    "obj",
}


def lp_variables(lp: str) -> int:
    """Distinct variable names in an LP file (row labels and keywords left out)."""
    labels = set(re.findall(r"^\s*(\w+):", lp, re.M))
    text = re.sub(r"^\\.*$", "", lp, flags=re.M)
    names = set(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", re.sub(r"^\s*\w+:", "", text, flags=re.M)))
    return len({name for name in names if name.lower() not in _LP_KEYWORDS and name not in labels})


def prepare(record: dict[str, Any]) -> None:
    """Do the per-text work `diversity_report` will need for `record` now (its caches keep it until
    the report): a synthesis run calls this as each sample is kept, while later shards are still
    being made, so the report at the end only counts (`stats.Tally`). The report is the same
    with or without it."""
    prompt, answer = record["messages"][1]["content"], record["messages"][2]["content"]
    _gram_set(answer, 5)
    _gram_set(prompt, 5)
    _gram_set(_prose(answer), 5)
    _sentences(_prose(answer))
    _part_grams(answer, 5)


def diversity_report(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The report of the module docstring, from SFT records."""
    try:
        return _diversity_report(records)
    finally:  # the n-gram ids and sets of this report's texts are of no use to the next one
        for cache in (_gram_set, _gram_array, _part_grams, _prose, _sentences):
            cache.cache_clear()
        _GRAM_IDS.clear()


def _diversity_report(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_family[record["meta"]["family"]].append(record)
    families: dict[str, Any] = {}
    sizes_all: list[int] = []
    for family, items in sorted(by_family.items()):
        prompts = [item["messages"][1]["content"] for item in items]
        answers = [item["messages"][2]["content"] for item in items]
        prose = [_prose(answer) for answer in answers]
        skeletons = Counter(skeleton(prompt) for prompt in prompts)
        sizes = [lp_variables(item["meta"]["lp"]) for item in items]
        sizes_all += sizes
        families[family] = {
            "samples": len(items),
            "skeletons": len(skeletons),
            "top_skeleton_share": round(skeletons.most_common(1)[0][1] / len(items), 4) if items else 0.0,
            "answer_overlap": overlap(answers),
            "answer_prose_overlap": overlap(prose),
            "answer_overlap_at": {k: overlap_at(answers, k) for k in OVERLAP_SIZES},
            "answer_parts": overlap_by_part(answers),
            "answer_parts_at": overlap_by_part_at(answers, PARTS_AT),
            "prompt_overlap": overlap(prompts),
            "repeated_sentences": repeated_sentences(prose),
            "code_templates": len({code_template(item["meta"]["program"]) for item in items}),
            "code_styles": len({code_style_key(item["meta"]["program"]) for item in items}),
            "code_libraries": len(
                {code_style_key(item["meta"]["program"]).split("/")[0].replace("alias", "from") for item in items}
            ),
            "size": {"min": min(sizes), "median": statistics.median(sizes), "max": max(sizes)} if sizes else {},
        }
    decades = Counter(f"{10 ** (len(str(size)) - 1)}-{10 ** len(str(size)) - 1}" for size in sizes_all)
    values = list(families.values())

    def mean(key: str) -> float:
        return round(sum(value[key] for value in values) / len(values), 4) if values else 0.0

    parts = {
        part: {
            key: round(sum(value["answer_parts"][part][key] for value in values) / len(values), 4) if values else 0.0
            for key in ("grams", "shared")
        }
        for part in PARTS
    }

    found_at = [value["answer_parts_at"] for value in values if value["answer_parts_at"] is not None]
    parts_at = (
        {
            part: {
                key: round(sum(found[part][key] for found in found_at) / len(found_at), 4)
                for key in ("grams", "shared")
            }
            for part in PARTS
        }
        if found_at and len(found_at) == len(values)
        else None
    )

    def mean_at(k: int) -> float | None:
        found = [value["answer_overlap_at"][k] for value in values if value["answer_overlap_at"][k] is not None]
        return round(sum(found) / len(found), 4) if found and len(found) == len(values) else None

    return {
        "families": families,
        "summary": {
            "answer_parts": parts,
            "answer_parts_at": {PARTS_AT: parts_at},
            "answer_overlap_at": {k: mean_at(k) for k in OVERLAP_SIZES},
            "answer_overlap": mean("answer_overlap"),
            "answer_prose_overlap": mean("answer_prose_overlap"),
            "prompt_overlap": mean("prompt_overlap"),
            "repeated_sentences": mean("repeated_sentences"),
            "min_skeletons": min((value["skeletons"] for value in values), default=0),
            "min_code_styles": min((value["code_styles"] for value in values), default=0),
            "min_code_libraries": min((value["code_libraries"] for value in values), default=0),
            "min_code_templates": min((value["code_templates"] for value in values), default=0),
            "size_decades": dict(sorted(decades.items(), key=lambda item: int(item[0].split("-")[0]))),
        },
    }


def diversity_markdown(report: dict[str, Any]) -> list[str]:
    summary = report["summary"]
    columns = (
        "family",
        "samples",
        "skeletons",
        "top skeleton",
        "answer overlap",
        "prose overlap",
        "prompt overlap",
        "repeated sentences",
        "code templates",
        "code styles",
        "variables (min/median/max)",
    )
    lines = [
        "Diversity (per family; overlap = share of an answer's masked 5-grams found in another answer of its family):",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + " --- |" * len(columns),
    ]
    for family, value in report["families"].items():
        size = value["size"]
        cells = [
            family,
            value["samples"],
            value["skeletons"],
            f"{value['top_skeleton_share']:.1%}",
            f"{value['answer_overlap']:.1%}",
            f"{value['answer_prose_overlap']:.1%}",
            f"{value['prompt_overlap']:.1%}",
            f"{value['repeated_sentences']:.1%}",
            value["code_templates"],
            value["code_styles"],
            f"{size.get('min')}/{size.get('median')}/{size.get('max')}",
        ]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    lines += [
        "",
        f"Mean over families: answer overlap {summary['answer_overlap']:.1%}, prose overlap {summary['answer_prose_overlap']:.1%}, "
        f"prompt overlap {summary['prompt_overlap']:.1%}, repeated sentences {summary['repeated_sentences']:.1%}; "
        f"fewest skeletons {summary['min_skeletons']}, fewest code styles {summary['min_code_styles']}; "
        f"variables per instance by decade: {summary['size_decades']}",
        "",
    ]
    if "answer_overlap_at" in summary:
        at = summary["answer_overlap_at"]
        lines += [
            "Answer overlap with every family cut to k random answers (the measure grows with k): "
            + "; ".join(
                f"k = {k}: " + (f"{value:.1%}" if value is not None else "- (a family has fewer answers)")
                for k, value in at.items()
            ),
            "",
        ]
    if "answer_parts" in summary:
        parts = summary["answer_parts"]
        lines += [
            "Where the answers' 5-grams come from (mean over families; share of the 5-grams, and of those the share "
            "found in another answer): "
            + "; ".join(f"{part} {value['grams']:.0%} ({value['shared']:.0%} shared)" for part, value in parts.items()),
            "",
        ]
    for k, parts_k in summary.get("answer_parts_at", {}).items():
        if parts_k:
            lines += [
                f"The same with every family cut to k = {k} random answers: "
                + "; ".join(
                    f"{part} {value['grams']:.0%} ({value['shared']:.0%} shared)" for part, value in parts_k.items()
                ),
                "",
            ]
    return lines
