"""What preloading highspy in the Pyomo worker group saves per Pyomo program.

    python bench/or_data/pyomo_preload.py --synth-dir DIR [--programs 20] [--rounds 4]

The synthesis's Pyomo programs solve through `SolverFactory("appsi_highs")`, which imports highspy
on first use. Two warm workers run side by side in the same process: one preloading what the
`pyomo` group preloaded before the ninth session (pyscipopt, pyomo.environ), one preloading the
group as it is now (`program_runner.POOLS["pyomo"]`, highspy added). The first `--programs` Pyomo
programs of a synthesis run's sft.jsonl run on each in alternating batches (`--rounds`, the order
rotated each round so the load falls on both alike); printed: sandbox-side CPU ms per program
(the workers' cgroup, or their own reports without one), min/median/max over rounds, their ratio,
and whether every program ran to an objective on both.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import sys
from pathlib import Path

from trex.workloads.or_data.program_runner import DEFAULT_LIMITS, POOLS
from trex.workloads.sandbox import Sandbox

PYOMO = re.compile(r"^\s*(?:import|from)\s+pyomo\b", re.M)
BEFORE = ("pyscipopt", "pyomo.environ")


def spread(values: list[float], digits: int = 1) -> str:
    return " / ".join(f"{value:.{digits}f}" for value in (min(values), statistics.median(values), max(values)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synth-dir", type=Path, required=True, help="a `trex data synth` output directory")
    parser.add_argument("--programs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    records = [json.loads(line) for line in (args.synth_dir / "sft.jsonl").read_text(encoding="utf-8").splitlines()]
    programs = [r["meta"]["program"] for r in records if PYOMO.search(r["meta"].get("program") or "")][: args.programs]
    if not programs:
        raise SystemExit(f"{args.synth_dir / 'sft.jsonl'} holds no Pyomo program")
    print(f"command: python {shlex.join(sys.argv)}")
    print(f"load average {os.getloadavg()[0]:.2f} at start")
    groups = {"before (pyscipopt, pyomo.environ)": BEFORE, f"now ({', '.join(POOLS['pyomo'])})": POOLS["pyomo"]}
    sandboxes = {label: Sandbox(DEFAULT_LIMITS, workers=1, preload=preload) for label, preload in groups.items()}
    per_program: dict[str, list[float]] = {label: [] for label in groups}
    ok: dict[str, int] = dict.fromkeys(groups, 0)
    try:
        for sandbox in sandboxes.values():
            sandbox.wait_ready()
            sandbox.run("pass")  # the worker's start-up is not a program's cost
        labels = list(groups)
        for round_ in range(args.rounds):
            for label in labels[round_ % 2 :] + labels[: round_ % 2]:
                sandbox = sandboxes[label]
                before = sandbox.worker_cpu_s
                executions = [sandbox.run(source) for source in programs]
                per_program[label].append(1000 * (sandbox.worker_cpu_s - before) / len(programs))
                ok[label] = sum(execution.ok for execution in executions)
        how = "the workers' cgroup" if sandboxes[labels[0]]._cgroup is not None else "the workers' reports"
    finally:
        for sandbox in sandboxes.values():
            sandbox.close()
    print(f"\n{len(programs)} Pyomo programs x {args.rounds} rounds; sandbox-side CPU from {how}\n")
    print("| warm worker preloads | CPU ms per program (min / median / max) | ran to an objective |")
    print("| --- | --- | --- |")
    for label in groups:
        print(f"| {label} | {spread(per_program[label])} | {ok[label]} of {len(programs)} |")
    ratios = [now / before for before, now in zip(*per_program.values(), strict=True)]
    print(
        f"\nnow / before per round (min / median / max): {spread(ratios, 2)}; load average {os.getloadavg()[0]:.2f} at the end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
