"""Where a sandboxed program's CPU goes: the sandbox's fixed cost against the program's own work.

    python bench/or_data/sandbox_cost.py --synth-dir DIR [--programs 100]

For warm workers that preload pyscipopt only, pyscipopt + PuLP + coptpy (the synthesis's `base`
worker group before the eighth session) and all five solver libraries (the default), runs `pass`
and the first `--programs` programs of a synthesis run's sft.jsonl that import none of PuLP,
coptpy and Pyomo (the programs `program_runner.pool_for` sends to its `scip` group), one at a time and prints CPU milliseconds per program: on the sandbox's side (the
worker's cgroup: fork, bootstrap, the program, clean-up; worker start-up excluded), of the
program's child alone, and in this process (the host side: request, answer, io files). Also the
floor of the fork-per-program design: fork + exit + wait of a Python process with those libraries
imported, in a plain process without any sandbox (wall milliseconds, median of 60).
CPU times need a writable cgroup v2 (`trex.workloads.sandbox.cgroups`); without one the
sandbox-side column is the worker's own report.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
from pathlib import Path

from trex.workloads.or_data.program_runner import DEFAULT_LIMITS
from trex.workloads.sandbox import Sandbox

ALL = ("pyscipopt", "coptpy", "highspy", "pulp", "pyomo.environ")
# programs importing any of these are left out (a source tree of any session can be measured)
OTHER_LIBRARY = re.compile(r"^\s*(?:import|from)\s+(?:pulp|coptpy|pyomo)\b", re.M)
FORK_FLOOR = """
import importlib, os, statistics, sys, time
for name in sys.argv[1:]:
    importlib.import_module(name)
times = []
for _ in range(60):
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    times.append(time.perf_counter() - started)
print(1000 * statistics.median(times))
"""


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_program(sandbox: Sandbox, sources: list[str]) -> tuple[float, float, float, int]:
    """(sandbox-side, child, host) CPU ms per program, and how many ran ok."""
    sandbox_before, host_before = sandbox.worker_cpu_s, own_cpu()
    executions = [sandbox.run(source) for source in sources]
    n = len(sources)
    return (
        1000 * (sandbox.worker_cpu_s - sandbox_before) / n,
        1000 * sum(execution.cpu_s for execution in executions) / n,
        1000 * (own_cpu() - host_before) / n,
        sum(execution.ok for execution in executions),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synth-dir", type=Path, required=True, help="a `trex data synth` output directory")
    parser.add_argument("--programs", type=int, default=100)
    parser.add_argument("--isolation", default="auto")
    args = parser.parse_args()
    records = [json.loads(line) for line in (args.synth_dir / "sft.jsonl").read_text(encoding="utf-8").splitlines()]
    programs = [
        record["meta"]["program"]
        for record in records
        if record["meta"].get("program") and not OTHER_LIBRARY.search(record["meta"]["program"])
    ][: args.programs]
    print(f"command: python {shlex.join(sys.argv)}")
    print(f"load average {os.getloadavg()[0]:.2f} at start\n")
    print(
        "| preloaded | isolation | programs | sandbox-side CPU ms/program | of which the child | host CPU ms/program | "
        "ran ok | fork+exit+wait floor, wall ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for preload in (("pyscipopt",), ("pyscipopt", "pulp", "coptpy"), ALL):
        floor = float(subprocess.check_output([sys.executable, "-c", FORK_FLOOR, *preload], text=True))
        with Sandbox(DEFAULT_LIMITS, isolation=args.isolation, workers=1, preload=preload) as sandbox:
            sandbox.wait_ready()
            for label, sources in (("`pass`", ["pass"] * len(programs)), ("synthesis programs", programs)):
                side, child, host, ok = per_program(sandbox, sources)
                print(
                    f"| {', '.join(preload)} | {sandbox.isolation} | {len(sources)} x {label} | {side:.1f} | "
                    f"{child:.1f} | {host:.1f} | {ok} | {floor:.1f} |"
                )
            measured_by = "the run cgroup" if sandbox._cgroup is not None else "the workers' reports"
    print(f"\nsandbox-side CPU read from {measured_by}; load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
