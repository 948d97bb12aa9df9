"""The LP-file check's SCIP solve: plain branch and bound against SCIP's defaults, side by side.

    python bench/or_data/lp_readback.py --synth-dir DIR [--n 1000]

DIR: a `trex data synth` output directory; its samples' verified LP files (`meta.lp`) are read by
SCIP and solved twice, with SCIP's default settings and with `solve.plain_branch_and_bound` (what
the `lp_scip` check uses), in the same process. Prints CPU ms per file for each and how many
verdicts (status, objective within `Outcome.matches`) differ.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from pyscipopt import Model

from trex.workloads.or_data.outcome import Outcome
from trex.workloads.or_data.solve import _solve_read_scip, lp_file, plain_branch_and_bound


def solve(lp: str, plain: bool):
    with lp_file(lp) as path:
        scip = Model()
        scip.hideOutput()
        scip.setParam("limits/time", 20.0)
        if plain:
            plain_branch_and_bound(scip)
        scip.readProblem(path)
    return _solve_read_scip(scip)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synth-dir", type=Path, required=True)
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    lines = (args.synth_dir / "sft.jsonl").read_text(encoding="utf-8").splitlines()[: args.n]
    files = [json.loads(line)["meta"]["lp"] for line in lines]
    print(f"load average {os.getloadavg()[0]:.2f} at start; {len(files)} LP files from {args.synth_dir}")
    cpu = {False: 0.0, True: 0.0}
    statuses: dict[str, int] = {}
    differ = 0
    for lp in files:
        verdicts = {}
        for plain in (False, True):
            started = time.process_time()
            verdicts[plain] = solve(lp, plain)
            cpu[plain] += time.process_time() - started
        default, plain = verdicts[False], verdicts[True]
        statuses[default.status] = statuses.get(default.status, 0) + 1
        same = default.status == plain.status and Outcome(plain.status, plain.objective).matches(
            Outcome(default.status, default.objective)
        )
        differ += not same
    print("| settings | CPU ms per file |")
    print("| --- | --- |")
    print(f"| SCIP defaults | {1000 * cpu[False] / len(files):.2f} |")
    print(f"| plain branch and bound | {1000 * cpu[True] / len(files):.2f} |")
    print(f"\nverdicts by SCIP's defaults: {statuses}; differing verdicts: {differ}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
