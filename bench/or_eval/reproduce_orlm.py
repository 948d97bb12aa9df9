"""Re-execute ORLM-LLaMA-3-8B's released programs and reproduce its published pass@1.

    python bench/or_eval/reproduce_orlm.py [--workers 2] [--isolation auto] [--baseline]

Runs every `to_run_script` of ORLM's NL4OPT and MAMO ComplexLP `executed.jsonl` files in the
sandbox (coptpy, as ORLM did), scores the results under the lenient, MAMO and strict rules,
and prints a markdown table with the published numbers next to ours and the sandbox's
throughput in programs per second. With --baseline it also runs the same programs as plain
`python program.py` subprocesses (no sandbox, no limits) with the same number of workers, so
the sandbox's overhead can be read off directly. CPU ms/program (this process and all it
started, worker start-up included; read from the sandbox's run cgroup where it has one, which
sees the bubblewrap containers that RUSAGE_CHILDREN misses) is the figure a loaded, shared machine
distorts least; cores / CPU per program is the rate an idle machine allows (an estimate).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from trex.workloads.or_eval import Rule, build_report, evaluate
from trex.workloads.or_eval.benchmarks import default_data_dir
from trex.workloads.or_eval.cli import SOLVER_MODULES
from trex.workloads.or_eval.replay_client import ReplayClient
from trex.workloads.sandbox import Limits, Sandbox

PUBLISHED = {  # ../shared/reference/or_benchmarks.md, pass@1 in percent
    "NL4OPT.executed.jsonl": {Rule.LENIENT: 85.7, Rule.MAMO: 77.6, Rule.STRICT: 77.6},
    "MAMO.ComplexLP.executed.jsonl": {Rule.LENIENT: 37.4, Rule.MAMO: 33.2, Rule.STRICT: 33.2},
}


def cpu_seconds() -> float:
    """CPU time of this process and of every descendant it has reaped (workers, programs, bwrap)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def own_cpu_seconds() -> float:
    """CPU time of this process alone (the evaluator: client, scoring, the sandbox's host side)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def baseline_programs_per_s(programs: list[str], workers: int) -> tuple[float, float]:
    """Plain subprocesses, as ORLM's eval/execute.py runs them: the floor the sandbox adds to.
    Returns programs per second and CPU seconds per program."""
    cpu_before = cpu_seconds()

    def run(source: str) -> None:
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "program.py")
            with open(path, "w", encoding="utf-8") as file:
                file.write(source)
            subprocess.run([sys.executable, path], cwd=work, capture_output=True, timeout=300)

    start = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, programs))
    return len(programs) / (time.monotonic() - start), (cpu_seconds() - cpu_before) / len(programs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--predictions-dir", default=str(default_data_dir() / "orlm_predictions"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--isolation", default="auto", choices=("auto", "bwrap", "namespaces", "process", "os"))
    parser.add_argument("--baseline", action="store_true", help="also time plain subprocesses without the sandbox")
    args = parser.parse_args()

    print(f"command: python {shlex.join(sys.argv)}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"coptpy {importlib.metadata.version('coptpy')}, load average {os.getloadavg()[0]:.2f} at start"
    )
    rows = []
    for name, published in PUBLISHED.items():
        client = ReplayClient(os.path.join(args.predictions_dir, name))
        benchmark = client.as_benchmark()
        cpu_before, own_before = cpu_seconds(), own_cpu_seconds()
        with Sandbox(
            Limits(wall_s=300, cpu_s=300),
            isolation=args.isolation,
            hide=[args.predictions_dir],
            workers=args.workers,
            preload=SOLVER_MODULES["orlm"],  # as `trex eval --form orlm` does: coptpy only
        ) as sandbox:
            sandbox.wait_ready()  # worker start-up (interpreter + solver imports, once per worker) is not per-program time
            run = evaluate(benchmark, client, sandbox, form="orlm", workers=args.workers, progress=False)
            isolation, cgroup = sandbox.isolation, sandbox.cgroup
            worker_cpu = sandbox.worker_cpu_s
            measured_by_cgroup = sandbox._cgroup is not None
        if measured_by_cgroup:  # the run cgroup saw every worker, bwrap and program: exact, nothing counted twice
            sandbox_cpu = (own_cpu_seconds() - own_before + worker_cpu) / len(benchmark)
        else:
            sandbox_cpu = (cpu_seconds() - cpu_before + worker_cpu) / len(benchmark)  # worker start-up included
        scores = {rule: 100 * build_report(run, rule).pass_at_1 for rule in Rule}
        failures = build_report(run, Rule.STRICT).failures
        baseline = None
        if args.baseline:
            baseline = baseline_programs_per_s(
                [record.record["to_run_script"] for record in client.records], args.workers
            )
        rows.append((name, len(benchmark), published, scores, run, isolation, failures, baseline, sandbox_cpu))
        cgroups_seen = cgroup

    print()
    print(
        "| set | programs | lenient (published) | mamo 1e-4 (published) | strict 1e-6 (published) | failures | programs/s | wall s | isolation |"
        + " CPU ms/program | idle-machine programs/s (cores / CPU per program) |"
        + (" plain subprocess programs/s | sandbox / plain | plain CPU ms/program |" if args.baseline else "")
    )
    print(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        + (" --- | --- | --- |" if args.baseline else "")
    )
    for name, size, published, scores, run, isolation, failures, baseline, sandbox_cpu in rows:
        cells = [f"{scores[rule]:.1f}% ({published[rule]:.1f}%)" for rule in (Rule.LENIENT, Rule.MAMO, Rule.STRICT)]
        failure_text = ", ".join(f"{kind} {count}" for kind, count in failures.items()) or "none"
        line = (
            f"| {name.split('.executed')[0]} | {size} | {' | '.join(cells)} | {failure_text} | {run.programs_per_s:.2f} | "
            f"{run.execution_wall_s:.1f} | {isolation} | {1000 * sandbox_cpu:.1f} | "
            f"{min(args.workers, os.cpu_count() or 1) / sandbox_cpu:.1f} |"
        )
        if args.baseline:
            rate, plain_cpu = baseline
            line += f" {rate:.2f} | {run.programs_per_s / rate:.1f}x | {1000 * plain_cpu:.0f} |"
        print(line)
    print(f"\ncgroup limits: {cgroups_seen}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
