"""Data synthesis on warm sandbox workers against the cold per-program sandbox and plain `python`.

    python bench/or_data/sandbox_side_by_side.py --n 1000 --workers 2 --programs 100 [--reference DIR]

In one invocation, same seed and settings:
1. `trex data synth` with `--isolation auto` (warm workers: bubblewrap where it runs) and with
   `--isolation namespaces` (one fresh interpreter per program: the sandbox as it was before warm
   workers), each as a whole command (start-up included): wall-clock samples per second, CPU
   seconds per sample of the whole process tree (`cpu_meter`: a cgroup of its own where one can be
   made, so the bubblewrap containers count), and `cores / CPU per sample`, the rate an idle
   machine of that many cores allows; whether the two runs wrote identical sft.jsonl/cpt.jsonl,
   and with `--reference DIR` whether they equal an earlier run's (e.g. one made by an older commit
   with the same --n and --seed); and the serial tail: how long the outputs took after the last
   shard was written;
2. the first K programs of the written samples run through the warm sandbox and as plain
   `python program.py` subprocesses (no sandbox, no limits), `--workers` at a time each:
   programs per second and the ratio, min/median/max over `--repeat` timings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_meter import Metered, metered  # noqa: E402 - a sibling of this script

OUTPUTS = ("sft.jsonl", "cpt.jsonl")


def synth(
    isolation: str, n: int, workers: int, seed: int, cpt_instances: str, families: str | None
) -> tuple[Metered, int, Path]:
    out = Path(tempfile.mkdtemp(prefix=f"or-data-{isolation}-"))
    shutil.rmtree(out)
    trex = shutil.which("trex", path=os.path.dirname(sys.executable)) or "trex"
    argv = [trex, "data", "synth", "--n", str(n), "--out", str(out), "--seed", str(seed), "--workers", str(workers)]
    argv += [
        "--isolation",
        isolation,
        "--no-progress",
        "--no-decontaminate",
        "--json",
        "--cpt-instances",
        cpt_instances,
    ]
    argv += ["--families", families] if families else []
    result = metered(argv, stdout=subprocess.DEVNULL)
    if result.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} failed with exit status {result.returncode}")
    samples = sum(1 for _ in (out / "sft.jsonl").open(encoding="utf-8"))
    return result, samples, out


def serial_tail_s(out: Path) -> float:
    """Seconds from the last shard file's write to the last output file's: what the run did after
    its workers' last result (merge, separation, statistics, writing)."""
    last_shard = max(path.stat().st_mtime for path in (out / "shards").glob("shard-*.jsonl"))
    outputs = ("sft.jsonl", "cpt.jsonl", "stats.json", "stats.md", "decontamination.json")
    return max((out / name).stat().st_mtime for name in outputs) - last_shard


def same_outputs(a: Path, b: Path) -> bool:
    return all((a / name).read_bytes() == (b / name).read_bytes() for name in OUTPUTS)


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
    from trex.workloads.or_data.program_runner import DEFAULT_LIMITS, PRELOAD
    from trex.workloads.sandbox import Sandbox

    with Sandbox(DEFAULT_LIMITS, isolation=isolation, workers=workers, preload=PRELOAD) as sandbox:
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
    parser.add_argument("--programs", type=int, default=100, help="programs for step 2 (0: skip it)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--isolation", default="auto")
    parser.add_argument("--cold", default="namespaces", help="the per-program-interpreter level to compare with")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold run (it is 3-5x slower)")
    parser.add_argument("--reference", type=Path, help="an earlier run's output directory (same --n and --seed)")
    parser.add_argument(
        "--cpt-instances",
        choices=("separate", "same", "none"),
        default="separate",
        help="`trex data synth --cpt-instances`: what the CPT documents are about (default: separate instances)",
    )
    parser.add_argument(
        "--families",
        help="`trex data synth --families A,B` (default: all): to compare with a run made before a family was added",
    )
    args = parser.parse_args()
    cores = min(args.workers, os.cpu_count() or 1)
    print(f"command: python {shlex.join(sys.argv)}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )

    runs = [("warm", args.isolation)] + ([] if args.no_cold else [("cold", args.cold)])
    results = {
        label: synth(isolation, args.n, args.workers, args.seed, args.cpt_instances, args.families)
        for label, isolation in runs
    }
    warm_out = results["warm"][2]
    print()
    print(
        "| run | isolation | samples | workers | wall s | samples/s | CPU s | CPU ms/sample | "
        f"idle {cores}-core samples/s (cores / CPU per sample) | CPU measured by |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, isolation in runs:
        meter, samples, _ = results[label]
        per_sample = meter.cpu_s / samples
        print(
            f"| {label} | {isolation} | {samples} | {args.workers} | {meter.wall_s:.1f} | {samples / meter.wall_s:.2f} | "
            f"{meter.cpu_s:.1f} | {1000 * per_sample:.1f} | {cores / per_sample:.1f} | {meter.how} |"
        )
    print(f"\nwarm output: {warm_out}")
    print(f"after the last shard was written, the outputs took {serial_tail_s(warm_out):.1f} s more (the serial tail)")
    identical = True
    if not args.no_cold:
        identical = same_outputs(warm_out, results["cold"][2])
        print(f"warm and cold outputs identical: {identical}")
    if args.reference is not None:
        matches = same_outputs(warm_out, args.reference)
        identical = identical and matches
        print(f"warm output identical to {args.reference}: {matches}")

    if args.programs == 0 or args.repeat == 0:
        print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
        return 0 if identical else 1
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
