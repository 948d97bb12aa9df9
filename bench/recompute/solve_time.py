"""Solve time of the recompute MILP for every layer kind of a full-size model's meta capture.

    python bench/recompute/solve_time.py deepseek-v4-flash --target h100

Captures each distinct decoder-layer kind on the meta device (`trex.meta_capture.capture_model`),
reads its save/recompute problem once (costs re-annotated for --target), and times
`trex.passes.recompute.choose` (model build + SCIP) at several budgets with the pass's default time
limit (CPU time), printing wall and CPU seconds (the machine may be shared). Prints status (optimal = within SCIP's 0.1%
gap; time_limit = best feasible answer at the limit), gap, seconds, saved bytes and recompute time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from trex.meta_capture import capture_model
from trex.passes.recompute import MemoryBudget, RecomputeBudgetError, choose, problem_for


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="deepseek-v4-flash")
    parser.add_argument("--target", default="h100")
    parser.add_argument("--budgets", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    capture = capture_model(args.model, include_ends=False)
    print(f"meta capture of {args.model}: {time.perf_counter() - start:.1f} s, {len(capture.kinds)} kinds", flush=True)
    seconds, cpu_seconds, limited = [], [], 0
    for kind in capture.kinds:
        problem = problem_for(kind.graph.joint, args.target, reannotate=True)
        values = sum(len(k.representative.values) for k in problem.kinds)
        print(
            f"{kind.name} (x{kind.count}): {values} forward values, save-everything "
            f"{problem.save_everything_bytes / 2**30:.2f} GiB",
            flush=True,
        )
        for budget in (float(b) for b in args.budgets.split(",")):
            try:
                solution, _ = choose(problem, MemoryBudget(fraction=budget))
            except RecomputeBudgetError as error:
                print(f"  budget {budget}: infeasible ({str(error).split('use ')[-1]})", flush=True)
                continue
            seconds.append(solution.seconds)
            cpu_seconds.append(solution.cpu_seconds)
            limited += solution.status == "time_limit"
            print(
                f"  budget {budget}: {solution.status} (gap {solution.gap:.2%}) in {solution.seconds:.2f} s "
                f"({solution.cpu_seconds:.2f} s CPU); "
                f"saved {solution.saved_bytes / 2**30:.2f} GiB, recompute {solution.objective_seconds * 1e3:.2f} ms",
                flush=True,
            )
    for label, xs in (("wall", seconds), ("CPU", cpu_seconds)):
        if xs:
            print(f"solve {label} seconds: min {min(xs):.2f} / median {statistics.median(xs):.2f} / max {max(xs):.2f}")
    print(f"{limited} of {len(seconds)} solves stopped at the time limit (best feasible answer, gap above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
