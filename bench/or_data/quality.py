"""Quality of the OR training data against issue 23's acceptance metrics, on a fresh run.

    python bench/or_data/quality.py --n 1000 --seed 23 --out runs/quality --workers 2
    python bench/or_data/quality.py --out runs/quality --reuse          # measure an existing run

Makes the run (or reuses one), then reports from its files alone:

| metric | acceptance |
| --- | --- |
| index-letter leaks, raw description fills in emitted samples (prose checker re-run on prompt and answer) | 0 |
| samples the prose checker flagged during generation (rejected), share of instances | <= 1% |
| infeasible / unbounded shares of the emitted samples vs the configuration | within 1 point |
| masked 5-gram overlap of answers within family (whole answer; prose alone and the split by part alongside) | <= 25% |
| prompt skeletons per family, code styles per family | >= 30, >= 3 |
| answers that give decisions (Optimal decision / plans) with units | all |
| speed (samples/s) and re-verification (`trex data verify` on `--verify` samples) | unchanged or better, 0 failures |

It also writes `review.md` in the run directory: `--review K` random samples (default 50) for
a human review against bench/or_data/RUBRIC.md.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

from trex.workloads.or_data.config import SynthConfig
from trex.workloads.or_data.diversity import diversity_report
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.prose_check import check_prose
from trex.workloads.or_data.style import split_sections
from trex.workloads.or_data.synthesis import synthesize

_NUMBER_THEN = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?!\d)(\s*)(\S*)")


# A plan line of an LP-input task, in the file's own names (`tasks.lp_plan`): the file gives no unit,
# so none is stated (a unit there would be invented); counted apart in the report.
LP_PLAN_LINE = re.compile(r"^`\w+` = −?-?[\d.]+(?: \(binary: chosen\))?$")


def decision_line_has_units(line: str) -> bool:
    """Every number in a decision line is followed by a word (its unit or what is counted), or
    the line has no number at all (a yes/no choice: "Choose the solar roof."). Numbers inside
    names ("Edge Site 2", "Week 1") and clock times ("04:00 shift") are not quantities. A line of
    an LP file's variable and value (`LP_PLAN_LINE`) has the only unit its input gives: none."""
    if LP_PLAN_LINE.match(line.strip()):
        return True
    line = re.sub(r"\b[A-Z][\w-]*(?: [A-Za-z][\w-]*)*? \d+\b", "NAME", line)
    line = re.sub(r"\b\d{1,2}:\d{2}(?:-\d{1,2}:\d{2})?\b", "TIME", line)
    for match in _NUMBER_THEN.finditer(line):
        number_, space, following = match.groups()
        if not space or not re.match(r"[A-Za-z×%$€£¥(]", following):
            if following.startswith(("%",)):
                continue
            return False
    return True


def decision_sections(answer: str) -> list[list[str]]:
    """The bullet lines of every plan the answer states (Optimal decision, and the plans of a
    What changes section)."""
    sections = split_sections(answer)
    plans = []
    for heading, body in sections.items():
        if heading in ("Optimal decision", "What changes"):
            lines = [
                line[2:].strip() for line in body.splitlines() if line.startswith("- ") and line[2:].strip() != "..."
            ]
            plans.append(lines)
    return plans


def measure(root: Path, config: SynthConfig) -> dict:
    records = [json.loads(line) for line in open(root / "sft.jsonl", encoding="utf-8") if line.strip()]
    stats = json.loads((root / "stats.json").read_text(encoding="utf-8"))
    flags: Counter = Counter()
    flagged_samples = 0
    for record in records:
        found = check_prose(record["messages"][1]["content"]) + check_prose(record["messages"][2]["content"])
        flags.update(flag.kind for flag in found)
        flagged_samples += bool(found)
    status = Counter(record["meta"]["status"] for record in records)
    asked, with_units, missing, lp_native = 0, 0, [], 0
    for record in records:
        meta = record["meta"]
        if meta["status"] != "optimal" or meta["variant"] == "repair":
            continue
        asked += 1
        plans = decision_sections(record["messages"][2]["content"])
        ok = bool(plans) and all(plan and all(decision_line_has_units(line) for line in plan) for plan in plans)
        with_units += ok
        lp_native += any(LP_PLAN_LINE.match(line.strip()) for plan in plans for line in plan)
        if not ok and len(missing) < 5:
            missing.append(meta["id"])
    diversity = diversity_report(records)
    prose = stats.get("prose", {"rejected": 0, "share": 0.0, "flags": {}})
    return {
        "samples": len(records),
        "instances": stats["verification"]["instances"],
        "emitted_prose_flags": dict(flags),
        "emitted_flagged_samples": flagged_samples,
        "generation_prose_rejected": prose["rejected"],
        "generation_prose_share": prose["share"],
        "generation_prose_flags": prose["flags"],
        "infeasible_share": round(status["infeasible"] / len(records), 4),
        "unbounded_share": round(status["unbounded"] / len(records), 4),
        "configured": {"infeasible": config.infeasible_share, "unbounded": config.unbounded_share},
        "decisions_asked": asked,
        "decisions_with_units": with_units,
        "decisions_lp_native": lp_native,
        "decisions_missing_examples": missing,
        "diversity": diversity,
        "removed": stats["removed"],
        "cpt_separation": stats.get("cpt_separation"),
        "cpt_documents": stats.get("cpt_documents"),
    }


def review_file(root: Path, count: int, seed: int) -> Path:
    records = [json.loads(line) for line in open(root / "sft.jsonl", encoding="utf-8") if line.strip()]
    chosen = sorted(random.Random(seed).sample(range(len(records)), min(count, len(records))))
    parts = [f"# Review sample: {len(chosen)} random samples of {root}\n"]
    for number_, index in enumerate(chosen, start=1):
        record = records[index]
        meta = record["meta"]
        parts.append(
            f"## {number_}. {meta['id']} ({meta['family']}, {meta['task']}/{meta['variant']}, {meta['status']})\n"
        )
        parts.append("### User\n\n````text\n" + record["messages"][1]["content"] + "\n````\n")
        parts.append("### Assistant\n\n````markdown\n" + record["messages"][2]["content"] + "\n````\n")
    path = root / "review.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def report_markdown(result: dict, wall: float | None, verify: dict | None) -> str:
    diversity = result["diversity"]
    summary = diversity["summary"]
    flags, prose = (
        result["emitted_prose_flags"],
        (result["generation_prose_rejected"], result["generation_prose_share"]),
    )
    configured = result["configured"]
    worst = max(value["answer_overlap"] for value in diversity["families"].values())
    speed = f"; synthesis wall {wall:.0f} s ({result['samples'] / wall:.2f} samples/s)" if wall else ""
    generation_flags = result["generation_prose_flags"] or "none"
    styles = f"{summary['min_code_styles']}; {summary['min_code_templates']}; {summary.get('min_code_libraries', 1)}"
    rows = [
        (
            "index-letter leaks / raw fills in emitted samples",
            f"{flags.get('index_leak', 0)} / {flags.get('raw_fill', 0)}",
            "0",
        ),
        ("emitted samples with any prose flag", result["emitted_flagged_samples"], "-"),
        ("instances rejected by the prose checker", f"{prose[0]} ({prose[1]:.2%}); {generation_flags}", "<= 1%"),
        (
            "infeasible share (configured)",
            f"{result['infeasible_share']:.1%} ({configured['infeasible']:.0%})",
            "within 1 point",
        ),
        (
            "unbounded share (configured)",
            f"{result['unbounded_share']:.1%} ({configured['unbounded']:.0%})",
            "within 1 point",
        ),
        (
            "masked 5-gram answer overlap within family (mean; max)",
            f"{summary['answer_overlap']:.1%}; {worst:.1%}",
            "<= 25%",
        ),
        ("same, answer prose only (mean)", f"{summary['answer_prose_overlap']:.1%}", "-"),
        (
            "same, every family cut to k random answers (k = 4 is the scale of the issue's 40-sample reading)",
            "; ".join(
                f"k = {k}: {value:.1%}" if value is not None else f"k = {k}: -"
                for k, value in summary.get("answer_overlap_at", {}).items()
            )
            or "-",
            "-",
        ),
        (
            "answer 5-grams by part: share of the 5-grams (share of those found in another answer)",
            "; ".join(
                f"{part} {value['grams']:.0%} ({value['shared']:.0%})"
                for part, value in summary.get("answer_parts", {}).items()
            )
            or "-",
            "-",
        ),
        (
            "same split, every family cut to k = 4 random answers",
            "; ".join(
                f"{part} {value['grams']:.0%} ({value['shared']:.0%})"
                for part, value in (summary.get("answer_parts_at", {}).get(4) or {}).items()
            )
            or "-",
            "-",
        ),
        ("repeated answer sentences (mean)", f"{summary['repeated_sentences']:.1%}", "-"),
        ("prompt skeletons per family (min)", summary["min_skeletons"], ">= 30"),
        ("code styles per family (min); code templates (min); solver libraries (min)", styles, ">= 3"),
        (
            "optimal answers stating the plan with units",
            f"{result['decisions_with_units']} of {result['decisions_asked']}"
            + (
                f" (of which {result['decisions_lp_native']} LP-input plans in the file's own names, which give no unit)"
                if result.get("decisions_lp_native")
                else ""
            ),
            "all",
        ),
        ("variables per instance by decade", summary["size_decades"], "-"),
        ("removed by the merger", result["removed"] or "none", "-"),
    ]
    separation = result.get("cpt_separation")
    if separation:
        rows.append(
            (
                "CPT documents (separate instances): kept; dropped as same instance / shared data 13-gram",
                f"{result['cpt_documents']}; {separation['dropped_same_instance']} / "
                f"{separation['dropped_shared_data_ngram']}",
                "-",
            )
        )
    if verify is not None:
        checked = f"{verify['checked']} checked, {verify['failed']} failed"
        rows.append(("re-verified from the files (`trex data verify`)", checked, "0 failed"))
    lines = [f"samples {result['samples']} from {result['instances']} instances{speed}", ""]
    lines += ["| metric | value | acceptance |", "| --- | --- | --- |"]
    lines += [f"| {name} | {value} | {target} |" for name, value, target in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reuse", action="store_true", help="measure the run in --out without synthesizing")
    parser.add_argument(
        "--verify", type=int, default=100, metavar="N", help="re-verify N random samples (0: none, -1: all)"
    )
    parser.add_argument("--review", type=int, default=50)
    args = parser.parse_args()
    config = SynthConfig(seed=args.seed, families=tuple(FAMILIES))
    root = Path(args.out)
    wall = None
    if not args.reuse:
        started = time.monotonic()
        synthesize(config, root, args.n, workers=args.workers, progress=False)
        wall = time.monotonic() - started
    result = measure(root, config)
    verify = None
    if args.verify:
        from trex.workloads.or_data.program_runner import ProgramRunner
        from trex.workloads.or_data.reverify import reverify

        records = [json.loads(line) for line in open(root / "sft.jsonl", encoding="utf-8") if line.strip()]
        if args.verify > 0:
            records = random.Random(args.seed).sample(records, min(args.verify, len(records)))
        with ProgramRunner(hide=(str(root.resolve()),)) as runner:
            verify = reverify(records, runner).to_json()
    review = review_file(root, args.review, args.seed)
    text = report_markdown(result, wall, verify)
    (root / "quality.json").write_text(
        json.dumps({**result, "wall_s": wall, "verify": verify}, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    (root / "quality.md").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    print(f"\nreview sample: {review}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
