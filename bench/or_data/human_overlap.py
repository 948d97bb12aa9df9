"""The overlap metric of `quality.py` on human-written OR text, at the same k, as a yardstick.

`diversity.overlap_at` (masked 5-gram overlap: the share of a text's distinct 5-grams, numbers and
capitalized names masked, that occur in another text of the group, with the group cut to k random
texts) is what the acceptance row "<= 25% within family" measures on generated answers. What a
human-written corpus scores on it says how far that bound is from natural text: word problems
written by people share phrases too ("how many of each should be made to maximize").

Measured here, on the files the evaluator reads (`workloads/or_eval/benchmarks.py`; the default
directory is /work/shared/data/or_bench, `--data` to change it):

- the benchmarks' questions (NL4OPT, MAMO EasyLP, MAMO ComplexLP, OptMATH): human-written
  (NL4OPT) or human-templated word problems, each file taken as one "family" (a mixed one: the
  figure is a lower bound on what a single problem type scores);
- NL4OPT's questions grouped by topic (keyword groups below), the nearest a human corpus gets
  to a family;
- the answers ORLM (an LLM fine-tuned on synthetic OR data) wrote to NL4OPT and MAMO ComplexLP
  (`orlm_predictions/*.executed.jsonl`, field `en_math_model_coptpy_code`: model and program):
  not human text, but answers, as the acceptance row measures, to varied human questions;
- when `--run DIR` names a `quality.py` output, the same metric on its prompts and answers per
  family, so the comparison is prompt against question at equal k.

    python bench/or_data/human_overlap.py [--run /tmp/q] [--data DIR]

Prints a markdown table; no timing, so no bench lock is needed.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from trex.workloads.or_data.diversity import PARTS, overlap_at, overlap_by_part_at

FILES = {
    "NL4OPT": "NL4OPT.json",
    "MAMO EasyLP": "MAMO_EasyLP.json",
    "MAMO ComplexLP": "MAMO_ComplexLP.json",
    "OptMATH": "OptMATH_Bench.json",
}
KS = (4, 15, 50)
# Topic groups for NL4OPT questions: the first group whose words occur decides (a rough family).
TOPICS = (
    ("transport / trips", r"\b(?:trips?|trucks?|vans?|boats?|carts?|deliver\w*|transport\w*)\b"),
    ("staffing / workers", r"\b(?:workers?|employees?|staff|shifts?|nurses?|hire|hiring)\b"),
    ("diet / nutrition", r"\b(?:vitamins?|protein|calories|nutrients?|diet|supplements?|pills?)\b"),
    ("investment / money", r"\b(?:invest\w*|portfolio|stocks?|bonds?|returns?)\b"),
    ("production / products", r"\b(?:produc\w*|manufactur\w*|factory|makes?|bakery|machines?)\b"),
)


def questions(path: Path) -> list[str]:
    """The `en_question` texts of a JSON-lines or JSON-array benchmark file."""
    text = path.read_text(encoding="utf-8").strip()
    if text.startswith("["):
        records = json.loads(text)
    else:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [record["en_question"] for record in records if record.get("en_question")]


def topic(question: str) -> str:
    for name, pattern in TOPICS:
        if re.search(pattern, question, re.I):
            return name
    return "other"


def row(name: str, texts: list[str]) -> str:
    figures = [overlap_at(texts, k, draws=32) for k in KS]
    shown = " | ".join("-" if value is None else f"{value:.1%}" for value in figures)
    return f"| {name} | {len(texts)} | {shown} |"


def run_rows(run: Path) -> list[str]:
    """Per family of a `quality.py` run: prompts and answers at the same k; the mean over families."""
    records = [json.loads(line) for line in open(run / "sft.jsonl", encoding="utf-8") if line.strip()]
    by_family: dict[str, dict[str, list[str]]] = defaultdict(lambda: {"prompt": [], "answer": []})
    for record in records:
        family = record["meta"]["family"]
        by_family[family]["prompt"].append(record["messages"][1]["content"])
        by_family[family]["answer"].append(record["messages"][2]["content"])
    rows = []
    for part in ("prompt", "answer"):
        means = []
        for k in KS:
            values = [overlap_at(texts[part], k, draws=32) for texts in by_family.values()]
            values = [value for value in values if value is not None]
            means.append(f"{statistics.mean(values):.1%}" if values else "-")
        rows.append(
            f"| generated {part}s, mean over {len(by_family)} families ({run.name}) | {len(records)} | {' | '.join(means)} |"
        )
    return rows


# A 1,000-sample run spreads its answers over 18 families: about 55 answers per family, the k at which
# the acceptance row ("<= 25% within family") is read.
RUN_K = 55
_PAREN_MATH = re.compile(r"\\\((.*?)\\\)|\\\[(.*?)\\\]", re.S)


def as_markdown_math(answer: str) -> str:
    """ORLM writes inline math as \\( ... \\) and display math as \\[ ... \\]; `answer_parts` reads
    $...$ and $$...$$, so the formulas are rewritten that way to land in the math part, not in prose."""
    return _PAREN_MATH.sub(lambda m: f"${m.group(1)}$" if m.group(1) is not None else f"$${m.group(2)}$$", answer)


def part_row(name: str, answers: list[str], k: int) -> str:
    """Overall overlap and, per part, the part's share of the 5-grams and the share of them shared
    with another answer of the group, at `k` answers (mean of 32 draws)."""
    whole = overlap_at(answers, k, draws=32)
    parts = overlap_by_part_at(answers, k, draws=32)
    if whole is None or parts is None:
        return f"| {name} | {len(answers)} | - | - |"
    shown = "; ".join(f"{part} {parts[part]['grams']:.0%} ({parts[part]['shared']:.0%})" for part in PARTS)
    return f"| {name} | {len(answers)} | {whole:.1%} | {shown} |"


def run_part_rows(run: Path, k: int) -> list[str]:
    """`part_row` per family of a `quality.py` run at `k`, and the mean over families."""
    records = [json.loads(line) for line in open(run / "sft.jsonl", encoding="utf-8") if line.strip()]
    by_family: dict[str, list[str]] = defaultdict(list)
    for record in records:
        by_family[record["meta"]["family"]].append(record["messages"][2]["content"])
    wholes, reports = [], []
    for answers in by_family.values():
        size = min(k, len(answers))
        wholes.append(overlap_at(answers, size, draws=32))
        reports.append(overlap_by_part_at(answers, size, draws=32))
    mean = {
        part: {key: statistics.mean(report[part][key] for report in reports) for key in ("grams", "shared")}
        for part in PARTS
    }
    shown = "; ".join(f"{part} {mean[part]['grams']:.0%} ({mean[part]['shared']:.0%})" for part in PARTS)
    sizes = sorted(len(answers) for answers in by_family.values())
    return [
        f"| this run's answers, mean over {len(by_family)} families (k = min({k}, family size); sizes "
        f"{sizes[0]}-{sizes[-1]}) | {len(records)} | {statistics.mean(wholes):.1%} | {shown} |"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/work/shared/data/or_bench")
    parser.add_argument("--run", default=None, help="a quality.py output directory (sft.jsonl)")
    parser.add_argument("--k", type=int, default=RUN_K, help="answers per group for the by-part table")
    args = parser.parse_args()
    data = Path(args.data)
    missing = [name for name in FILES.values() if not (data / name).is_file()]
    if len(missing) == len(FILES):
        raise SystemExit(f"no benchmark file under {data}; pass --data DIR with {', '.join(FILES.values())}")
    lines = [
        "| corpus (masked 5-gram overlap, mean of 32 draws) | texts | k = 4 | k = 15 | k = 50 |",
        "| --- | --- | --- | --- | --- |",
    ]
    nl4opt: list[str] = []
    orlm: dict[str, list[str]] = {}
    for name, file in FILES.items():
        if not (data / file).is_file():
            continue
        texts = questions(data / file)
        if name == "NL4OPT":
            nl4opt = texts
        lines.append(row(f"{name} questions (human-written)" if name == "NL4OPT" else f"{name} questions", texts))
    for name, file in (("NL4OPT", "NL4OPT.executed.jsonl"), ("MAMO ComplexLP", "MAMO.ComplexLP.executed.jsonl")):
        path = data / "orlm_predictions" / file
        if path.is_file():
            answers = [
                record["en_math_model_coptpy_code"]
                for record in (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line)
                if record.get("en_math_model_coptpy_code")
            ]
            lines.append(row(f"ORLM's answers to {name} (model-written: model + program)", answers))
            orlm[name] = [as_markdown_math(answer) for answer in answers]
    groups: dict[str, list[str]] = defaultdict(list)
    for question in nl4opt:
        groups[topic(question)].append(question)
    for name, texts in sorted(groups.items()):
        lines.append(row(f"NL4OPT, topic '{name}'", texts))
    if args.run:
        lines += run_rows(Path(args.run))
    lines += [
        "",
        f"| answers at k = {args.k} (as many as one family of a 1,000-sample run) | texts | overlap | by part: "
        "share of 5-grams (share of them shared) |",
        "| --- | --- | --- | --- |",
    ]
    for name, answers in orlm.items():
        lines.append(part_row(f"ORLM's answers to {name}", answers, args.k))
    if len(orlm) > 1:
        lines.append(
            part_row("ORLM's answers to both, pooled", [a for answers in orlm.values() for a in answers], args.k)
        )
    if args.run:
        lines += run_part_rows(Path(args.run), args.k)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
