"""Where a synthesised sample's CPU goes, part by part: the floor of `trex data synth` per sample.

    python bench/or_data/sample_cpu_parts.py [--seed 0] [--start 300] [--count 100]

One process makes indices START..START+COUNT of the seed the way a `--workers N` worker does
(`pipeline.synthesize_shard` on a `ShardContext`, after a warm-up shard that starts the sandbox's
warm workers), then merges them and computes the run's statistics the way the coordinator does
(`Merger` with a `stats.Tally`, then the CPT separation and `build_stats`). Printed, in CPU
milliseconds per index (process CPU from `time.process_time`, each part timed where it runs, so
the parts do not overlap):

| part | what |
| --- | --- |
| SCIP model solves | `solve._build_and_solve`: the verifier's solve, a MIP's polish, the tasks' variants |
| HiGHS solves | `solve._solve_lp_text_highs`, `solve.solve_read_highs`: a MIP optimum re-solved from its LP file, the judge's solves |
| LP read-backs | `lp_structure.scip_read_back` and `highs_read`/`highs_read_back` (the `lp_scip`/`lp_highs` checks) |
| sandbox, host side | `ProgramRunner.run` in this process: request, answer, io files |
| the rest in-process | generation, prose, checks, DTA, the judge, records |
| sandboxed programs | the warm workers' CPU (`ProgramRunner.worker_cpu_s`: their cgroup, or their reports) |
| coordinator | the merger, the tally, the separation and the statistics (the coordinating process) |

The sum over parts is what one sample costs on any number of cores; `--workers 2` on two idle
cores can do at most 2000 / sum samples per second.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections import defaultdict

from trex.workloads.or_data import lp_structure, solve, verify
from trex.workloads.or_data.config import SynthConfig
from trex.workloads.or_data.cpt_separation import Separation
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.merge import Merger
from trex.workloads.or_data.pipeline import ShardContext, synthesize_shard
from trex.workloads.or_data.program_runner import POOLS, ProgramRunner, pool_for
from trex.workloads.or_data.stats import Tally, approximate_tokens, build_stats

SPENT: dict[str, float] = defaultdict(float)
RUNS: dict[str, int] = defaultdict(int)  # ProgramRunner.run calls (cache hits included) by worker group
_ACTIVE: list[str] = []


def timed(part: str, function):
    """`function`, its CPU charged to `part` (and not to an enclosing timed part)."""

    def wrapper(*args, **kwargs):
        started = time.process_time()
        _ACTIVE.append(part)
        try:
            return function(*args, **kwargs)
        finally:
            _ACTIVE.pop()
            spent = time.process_time() - started
            SPENT[part] += spent
            if _ACTIVE:
                SPENT[_ACTIVE[-1]] -= spent

    return wrapper


def instrument() -> None:
    solve._build_and_solve = timed("SCIP model solves", solve._build_and_solve)
    solve._solve_lp_text_highs = timed("HiGHS solves", solve._solve_lp_text_highs)
    verify.solve_read_highs = timed("HiGHS solves", solve.solve_read_highs)
    verify.scip_read_back = timed("LP read-backs", lp_structure.scip_read_back)
    verify.highs_read = timed("LP read-backs", lp_structure.highs_read)
    verify.highs_read_back = timed("LP read-backs", lp_structure.highs_read_back)
    ProgramRunner.run = timed("sandbox, host side", ProgramRunner.run)
    original = ProgramRunner.run

    def counted(self, source, *args, **kwargs):
        RUNS[pool_for(source)] += 1
        return original(self, source, *args, **kwargs)

    ProgramRunner.run = counted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=300)
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    print(f"command: python {shlex.join(sys.argv)}")
    print(f"load average {os.getloadavg()[0]:.2f} at start")
    config = SynthConfig(seed=args.seed, families=tuple(FAMILIES))
    context = ShardContext(config)
    try:
        synthesize_shard(range(10**6, 10**6 + 4), context)  # lazy imports done
        for pool in POOLS:  # every warm worker started: their start-up is not a sample's cost
            context.runner.sandbox_for(pool).wait_ready()
        instrument()
        sandboxes = context.runner._sandboxes
        pools_before = {pool: sandbox.worker_cpu_s for pool, sandbox in sandboxes.items()}
        workers_before, runs_before, started = context.runner.worker_cpu_s, context.runner.runs, time.process_time()
        results = synthesize_shard(range(args.start, args.start + args.count), context)
        in_process = time.process_time() - started
        programs = context.runner.worker_cpu_s - workers_before
        by_pool = {pool: sandboxes[pool].worker_cpu_s - before for pool, before in pools_before.items()}
        runs = context.runner.runs - runs_before
    finally:
        context.close()
    started = time.process_time()
    tally = Tally(approximate_tokens, Separation())
    merger = Merger(len(results), None, tally=tally)
    merger.feed(results)
    merger.cpt, separated = tally.separate()
    stats = build_stats(merger, approximate_tokens, "approximate")
    stats["cpt_separation"] = separated.to_json()
    json.dumps(stats)
    coordinator = time.process_time() - started

    n = args.count
    parts = dict(SPENT)
    parts["the rest in-process"] = in_process - sum(SPENT.values())
    parts["sandboxed programs"] = programs
    for pool, seconds in by_pool.items():
        parts[f"... of which the `{pool}` worker ({', '.join(POOLS[pool])})"] = seconds
    parts["coordinator"] = coordinator
    print(
        f"\n{n} indices ({sum(r['result'] == 'emitted' for r in results)} emitted), {runs} programs run "
        f"(runner calls by worker group, cache hits included: {dict(RUNS)})\n"
    )
    print("| part | CPU ms per index |")
    print("| --- | --- |")
    for part, seconds in parts.items():
        print(f"| {part} | {1000 * seconds / n:.1f} |")
    total = sum(seconds for part, seconds in parts.items() if not part.startswith("..."))
    print(f"| **sum** | **{1000 * total / n:.1f}** |")
    print(
        f"\nat most {2 * n / total:.1f} indices/s on two idle cores; load average {os.getloadavg()[0]:.2f} at the end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
