"""Does HiGHS confirm a MIP optimum faster when it starts from SCIP's optimum?

    python bench/or_data/highs_start_solution.py [--seeds 10] [--repeat 3]

The verifier re-solves every MIP optimum from its LP file with HiGHS (`verify._check_lp_file`).
This script takes every family's optimal MIP instances for seeds 0..SEEDS-1 (the generator's
`data` stream, as the pipeline draws them), solves each with SCIP (`solve.solve_model`), reads its
LP file with HiGHS (`lp_structure.highs_read`, the pipeline's settings) and runs HiGHS once plain
and once with SCIP's values given as the starting solution (`Highs.setSolution`), in alternating
order, REPEAT times. Printed: HiGHS's process CPU per MIP (`time.process_time` around `run`) and
its branch-and-bound nodes, plain against started, with min/median/max of the per-instance ratio
(started / plain), and whether the two verdicts agree on every instance.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time

import numpy as np

from trex.workloads.or_data import lp_structure, solve
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.lp_format import write_lp
from trex.workloads.or_data.outcome import Outcome
from trex.workloads.or_data.seeds import stream


def mip_cases(seeds: int) -> list[tuple[str, str, solve.SolveResult]]:
    """(family, LP file, SCIP's optimum) of each optimal MIP instance."""
    cases = []
    for name, family in FAMILIES.items():
        for seed in range(seeds):
            try:
                made = family.generate(stream(seed, 0, "data"), "optimal")
            except Exception:  # noqa: BLE001 - a family that cannot draw this seed is skipped
                continue
            model = family.linear_model(made.data)
            if not model.is_mip:
                continue
            result = solve.solve_model(model)
            if result.status == "optimal":
                cases.append((name, write_lp(model), result))
    return cases


def run_highs(lp: str, start: dict[str, float] | None) -> tuple[float, int, Outcome]:
    """HiGHS's CPU seconds, nodes and verdict on `lp`, started from `start` when given."""
    highs = lp_structure.highs_read(lp)
    if start is not None:
        names = list(highs.getLp().col_names_)
        columns = [j for j, name in enumerate(names) if name in start]
        values = [start[names[j]] for j in columns]
        highs.setSolution(len(columns), np.array(columns, dtype=np.int32), np.array(values, dtype=np.float64))
    started = time.process_time()
    highs.run()
    spent = time.process_time() - started
    status = highs.modelStatusToString(highs.getModelStatus())
    verdict = Outcome("optimal", highs.getInfo().objective_function_value) if status == "Optimal" else Outcome("other")
    return spent, int(highs.getInfo().mip_node_count), verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"command: python {shlex.join(sys.argv)}")
    print(f"load average {os.getloadavg()[0]:.2f} at start")
    cases = mip_cases(args.seeds)
    cpu = {"plain": [0.0] * len(cases), "started": [0.0] * len(cases)}
    nodes = {"plain": 0, "started": 0}
    disagree = 0
    for repeat in range(args.repeat):
        for i, (_, lp, scip) in enumerate(cases):
            order = ("plain", "started") if repeat % 2 == 0 else ("started", "plain")
            verdicts = {}
            for label in order:
                spent, count, verdict = run_highs(lp, scip.values if label == "started" else None)
                cpu[label][i] += spent
                nodes[label] += count
                verdicts[label] = verdict
            disagree += not verdicts["plain"].matches(verdicts["started"])
    runs = args.repeat * len(cases)
    print(
        f"\n{len(cases)} optimal MIPs ({len(FAMILIES)} families, seeds 0-{args.seeds - 1}), {args.repeat} runs each\n"
    )
    print("| HiGHS run | CPU ms per MIP | nodes per MIP |")
    print("| --- | --- | --- |")
    for label in ("plain", "started"):
        print(f"| {label} | {1000 * sum(cpu[label]) / runs:.2f} | {nodes[label] / runs:.2f} |")
    ratios = [s / p for s, p in zip(cpu["started"], cpu["plain"], strict=True) if p > 0]
    print(
        f"\nstarted / plain CPU per instance: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}, "
        f"max {max(ratios):.2f}; total {sum(cpu['started']) / sum(cpu['plain']):.2f}"
    )
    print(f"verdicts that differ: {disagree} of {runs}; load average {os.getloadavg()[0]:.2f} at the end")
    return 0 if disagree == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
