"""Data synthesis on warm sandbox workers against the cold per-program sandbox and plain `python`.

    python bench/or_data/sandbox_side_by_side.py --n 200 --workers 2 --programs 100

In one invocation, same seed and settings:
1. `synthesize` with `--isolation auto` (warm workers: bubblewrap where it runs) and with
   `namespaces` (one fresh interpreter per program: the sandbox as it was before warm workers),
   verified samples per second each, and whether the two runs wrote identical sft.jsonl/cpt.jsonl;
2. the first K programs of the written samples run through the warm sandbox and as plain
   `python program.py` subprocesses (no sandbox, no limits), `--workers` at a time each:
   programs per second and the ratio.
Prints markdown tables with min/median/max over `--repeat` timings of step 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def synth(isolation: str, n: int, workers: int, seed: int) -> tuple[float, Path]:
    from trex.workloads.or_data.config import SynthConfig
    from trex.workloads.or_data.synthesis import synthesize

    out = Path(tempfile.mkdtemp(prefix=f"or-data-{isolation}-"))
    started = time.monotonic()
    config = SynthConfig(seed=seed, isolation=isolation)
    result = synthesize(config, out, n, workers=workers, bench_dir=None, progress=False)
    wall = time.monotonic() - started
    return result.stats["samples"] / wall, out


def plain_programs_per_s(programs: list[str], workers: int) -> float:
    def run(source: str) -> None:
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "program.py")
            Path(path).write_text(source, encoding="utf-8")
            subprocess.run([sys.executable, path], cwd=work, capture_output=True, timeout=300)

    started = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, programs))
    return len(programs) / (time.monotonic() - started)


def sandbox_programs_per_s(programs: list[str], workers: int, isolation: str) -> tuple[float, str, int]:
    from trex.workloads.or_data.program_runner import DEFAULT_LIMITS
    from trex.workloads.sandbox import Sandbox

    with Sandbox(DEFAULT_LIMITS, isolation=isolation, workers=workers) as sandbox:
        sandbox.wait_ready()
        started = time.monotonic()
        with ThreadPoolExecutor(workers) as pool:
            executions = list(pool.map(sandbox.run, programs))
        rate = len(programs) / (time.monotonic() - started)
        return rate, sandbox.isolation, sum(execution.ok for execution in executions)


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--programs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--isolation", default="auto")
    parser.add_argument("--cold", default="namespaces", help="the per-program-interpreter level to compare with")
    args = parser.parse_args()
    print(f"command: python {shlex.join(sys.argv)}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )

    warm_rate, warm_out = synth(args.isolation, args.n, args.workers, args.seed)
    cold_rate, cold_out = synth(args.cold, args.n, args.workers, args.seed)
    names = ("sft.jsonl", "cpt.jsonl")
    identical = all((warm_out / name).read_bytes() == (cold_out / name).read_bytes() for name in names)
    print()
    # no CPU column: a bwrap container's CPU time does not reach RUSAGE_CHILDREN, so it would flatter warm
    print("| samples | workers | warm samples/s | cold samples/s | warm / cold | outputs identical |")
    print("| --- | --- | --- | --- | --- | --- |")
    ratio = warm_rate / cold_rate
    print(f"| {args.n} | {args.workers} | {warm_rate:.2f} | {cold_rate:.2f} | {ratio:.1f}x | {identical} |")

    records = [json.loads(line) for line in (warm_out / "sft.jsonl").read_text(encoding="utf-8").splitlines()]
    programs = [record["meta"]["program"] for record in records if record["meta"].get("program")][: args.programs]
    sandboxed, plain, ratios = [], [], []
    for _ in range(args.repeat):
        rate, isolation, ok = sandbox_programs_per_s(programs, args.workers, args.isolation)
        baseline = plain_programs_per_s(programs, args.workers)
        sandboxed.append(rate)
        plain.append(baseline)
        ratios.append(rate / baseline)
    print()
    print(
        "| programs | isolation | sandboxed programs/s (min/median/max) | plain python programs/s | "
        "sandboxed / plain | ran ok |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| {len(programs)} | {isolation} | {spread(sandboxed)} | {spread(plain)} | {spread(ratios)} | {ok} |")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
