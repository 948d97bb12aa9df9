"""OR training data: samples per second, and the share of generated instances that verify.

    /work/venv/bin/python bench/or_data/throughput.py --n 1000 --workers 2
    /work/venv/bin/python bench/or_data/throughput.py --resume runs/ordata10k --reverify 500

Makes a fresh run (programmatic teacher, decontamination against the OR benchmarks) in a
temporary directory (or measures a finished run with --resume DIR, using the wall time it
recorded), then re-verifies a sample of the written records from the files alone
(`trex data verify`'s checks). Prints one markdown table row per measurement and, with --json,
the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard-size", type=int, default=25)
    parser.add_argument("--bench-dir", default=os.environ.get("TREX_OR_BENCH_DIR", "../shared/data/or_bench"))
    parser.add_argument("--resume", metavar="DIR", help="measure a finished run instead of making one")
    parser.add_argument(
        "--reverify", type=int, default=200, metavar="K", help="re-verify K random written records (default: 200)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from trex.workloads.or_data.config import SynthConfig
    from trex.workloads.or_data.program_runner import ProgramRunner
    from trex.workloads.or_data.reverify import reverify
    from trex.workloads.or_data.synthesis import synthesize

    if args.resume:
        out = Path(args.resume)
        stats = json.loads((out / "stats.json").read_text())
        wall = None
    else:
        out = Path(tempfile.mkdtemp(prefix="or-data-bench-"))
        started = time.monotonic()
        result = synthesize(
            SynthConfig(seed=args.seed, shard_size=args.shard_size),
            out,
            args.n,
            workers=args.workers,
            bench_dir=args.bench_dir,
            progress=False,
        )
        wall = time.monotonic() - started
        stats = result.stats
    records = [json.loads(line) for line in (out / "sft.jsonl").read_text(encoding="utf-8").splitlines()]
    chosen = random.Random(0).sample(records, min(args.reverify, len(records)))
    started = time.monotonic()
    with ProgramRunner() as runner:
        report = reverify(chosen, runner)
    reverify_s = time.monotonic() - started
    verification = stats["verification"]
    numbers = {
        "samples": stats["samples"],
        "workers": args.workers,
        "wall_s": None if wall is None else round(wall, 1),
        "samples_per_s": None if wall is None else round(stats["samples"] / wall, 2),
        "instances": verification["instances"],
        "verified": verification["verified"],
        "pass_share": verification["pass_share"],
        "failures": verification["failures"],
        "selection_drops": stats["selection_drops"],
        "removed": stats["removed"],
        "decontamination_flagged": stats["decontamination"]["flagged"],
        "decontamination_checked": stats["decontamination"]["checked"],
        "reverified": report.checked,
        "reverify_failed": len(report.failures),
        "reverify_s": round(reverify_s, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average": [round(value, 2) for value in os.getloadavg()],
    }
    if args.json:
        json.dump(numbers, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(
            "| samples | workers | wall s | samples/s | instances | verified | pass share | failures | decontaminated | re-verified (failed) |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        print(
            f"| {numbers['samples']} | {numbers['workers']} | {numbers['wall_s']} | {numbers['samples_per_s']} | {numbers['instances']} | "
            f"{numbers['verified']} | {numbers['pass_share']:.2%} | {numbers['failures'] or 'none'} | "
            f"{numbers['decontamination_flagged']} of {numbers['decontamination_checked']} | {numbers['reverified']} ({numbers['reverify_failed']}) |"
        )
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
