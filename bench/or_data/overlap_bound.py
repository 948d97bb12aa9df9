"""What the acceptance row "masked 5-gram answer overlap within family <= 25%" would require.

The row is read on a 1,000-sample run, about 55 answers per family. An answer is prose, a program,
an LP file and formulas (`diversity.answer_parts`); each part's 5-grams are shared with other answers
at its own rate. With the parts' shares of the 5-grams `g_p` and their shared fractions `s_p`, the
pooled overlap is `sum_p g_p s_p`; so even prose that shared nothing would leave the overlap at
`floor = sum over code, LP, math of g_p s_p`, and the prose would have to fall to
`(0.25 - floor) / g_prose` for the whole to reach 25% (negative: no prose can). Printed here for a
`quality.py` run (one family at a time, mean over families) and for ORLM's answers (ORLM, Tang et al.
2024, a model fine-tuned on synthetic OR data; its answers to NL4OPT and MAMO ComplexLP, the files
`human_overlap.py` reads), at k = 4, 15 and 55 answers per group, with the metric on the prose alone
(each answer reduced to its prose part, as if code, LP and math were left out of the answer).

    python bench/or_data/overlap_bound.py --run /tmp/q [--data DIR] [--draws 32]

No timing, so no bench lock is needed. The metric and the criterion are `diversity`'s, unchanged.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from human_overlap import as_markdown_math

from trex.workloads.or_data.diversity import PARTS, answer_parts, overlap_at, overlap_by_part_at

KS = (4, 15, 55)
BOUND = 0.25
ORLM_FILES = (("NL4OPT", "NL4OPT.executed.jsonl"), ("MAMO ComplexLP", "MAMO.ComplexLP.executed.jsonl"))


def measure(groups: list[list[str]], k: int, draws: int) -> dict:
    """The overlap, its parts and the prose-alone overlap at `k` per group (k = the group's size where
    it is smaller), averaged over the groups."""
    wholes, prose_alone, reports = [], [], []
    for answers in groups:
        size = min(k, len(answers))
        wholes.append(overlap_at(answers, size, draws=draws))
        prose_alone.append(overlap_at([answer_parts(answer)["prose"] for answer in answers], size, draws=draws))
        reports.append(overlap_by_part_at(answers, size, draws=draws))
    parts = {
        part: {key: statistics.mean(r[part][key] for r in reports) for key in ("grams", "shared")} for part in PARTS
    }
    floor = sum(parts[p]["grams"] * parts[p]["shared"] for p in PARTS if p != "prose")
    pooled = floor + parts["prose"]["grams"] * parts["prose"]["shared"]
    needed = (BOUND - floor) / parts["prose"]["grams"] if parts["prose"]["grams"] else float("nan")
    return {
        "whole": statistics.mean(wholes),
        "prose_alone": statistics.mean(prose_alone),
        "parts": parts,
        "floor": floor,
        "pooled": pooled,
        "needed": needed,
    }


def line(name: str, texts: int, k: int, m: dict) -> str:
    parts = "; ".join(f"{p} {m['parts'][p]['grams']:.0%} ({m['parts'][p]['shared']:.0%})" for p in PARTS)
    needed = f"{m['needed']:.0%}" if m["needed"] >= 0 else f"impossible ({m['needed']:.0%})"
    return (
        f"| {name} | {texts} | {k} | {m['whole']:.1%} | {parts} | {m['prose_alone']:.1%} | {m['floor']:.1%} | "
        f"{needed} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a quality.py output directory (sft.jsonl)")
    parser.add_argument("--data", default="/work/shared/data/or_bench")
    parser.add_argument("--draws", type=int, default=32)
    args = parser.parse_args()
    run, data = Path(args.run), Path(args.data)
    if not (run / "sft.jsonl").is_file():
        raise SystemExit(f"no sft.jsonl under {run}; pass --run with a quality.py output directory")
    families: dict[str, list[str]] = defaultdict(list)
    for text in (run / "sft.jsonl").read_text(encoding="utf-8").splitlines():
        if text.strip():
            record = json.loads(text)
            families[record["meta"]["family"]].append(record["messages"][2]["content"])
    orlm: dict[str, list[str]] = {}
    for name, file in ORLM_FILES:
        path = data / "orlm_predictions" / file
        if path.is_file():
            records = [json.loads(text) for text in path.read_text(encoding="utf-8").splitlines() if text]
            orlm[name] = [
                as_markdown_math(r["en_math_model_coptpy_code"]) for r in records if r.get("en_math_model_coptpy_code")
            ]
    print(
        "| answers | texts | k | overlap | by part: share of 5-grams (share of them shared) | prose alone | "
        "floor: overlap if the prose shared nothing | prose share needed for 25% |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    sizes = sorted(len(a) for a in families.values())
    for k in KS:
        name = f"this run, one family at a time (mean of {len(families)}; sizes {sizes[0]}-{sizes[-1]})"
        print(line(name, sum(sizes), k, measure(list(families.values()), k, args.draws)), flush=True)
    for k in KS:
        for name, answers in orlm.items():
            print(
                line(f"ORLM's answers to {name} (all types mixed)", len(answers), k, measure([answers], k, args.draws))
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
