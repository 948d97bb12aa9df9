"""How close the generated text comes to the OR benchmarks: n-gram overlap at several n.

    /work/venv/bin/python bench/or_data/overlap.py runs/ordata10k --n 13 10 8

The run itself decontaminates at 13 words (GPT-3's rule) and drops any sample sharing one; this
measures the margin: for shorter n-grams, how many written samples (prompt + answer) and CPT
documents share at least one with some benchmark text, and which n-grams and files those are.
Shared short n-grams are mostly stock phrases of the domain ("the total cost of ..."), which is
why the run does not decontaminate at small n.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a finished run directory (sft.jsonl, cpt.jsonl)")
    parser.add_argument("--n", type=int, nargs="+", default=[13, 10, 8])
    parser.add_argument("--bench-dir", default="../shared/data/or_bench")
    parser.add_argument("--limit", type=int, help="look at the first N samples only")
    args = parser.parse_args()

    from trex.workloads.or_data.decontamination import BenchmarkIndex

    root = Path(args.run)
    sft = [json.loads(line) for line in (root / "sft.jsonl").read_text(encoding="utf-8").splitlines()][: args.limit]
    cpt = [json.loads(line)["text"] for line in (root / "cpt.jsonl").read_text(encoding="utf-8").splitlines()][
        : args.limit
    ]
    texts = [f"{r['messages'][1]['content']}\n{r['messages'][2]['content']}" for r in sft]
    print(f"{len(sft)} samples and {len(cpt)} documents from {root}\n")
    print("| n | samples sharing an n-gram | documents sharing one | files matched (samples) | most shared n-grams |")
    print("| --- | --- | --- | --- | --- |")
    for n in args.n:
        index = BenchmarkIndex.from_dir(args.bench_dir, n)
        grams: Counter = Counter()
        files: Counter = Counter()
        hit_samples = 0
        for text in texts:
            found = index.matches(text, limit=50)
            hit_samples += bool(found)
            grams.update({match.ngram for match in found})
            files.update({match.source.file for match in found})
        hit_documents = sum(bool(index.matches(text, limit=1)) for text in cpt)
        top = "; ".join(f'"{gram}" ({count})' for gram, count in grams.most_common(3)) or "none"
        print(
            f"| {n} | {hit_samples} ({hit_samples / max(1, len(texts)):.1%}) | {hit_documents} ({hit_documents / max(1, len(cpt)):.1%}) | "
            f"{dict(files.most_common(4)) or 'none'} | {top} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
