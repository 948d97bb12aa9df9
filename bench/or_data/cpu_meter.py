"""Run a command and measure the CPU time of everything it starts, bubblewrap containers included.

    result = metered(["trex", "data", "synth", ...])      # Metered(wall_s, cpu_s, how, returncode)

Where this process may create a cgroup v2 directory (see `trex.workloads.sandbox.cgroups`), the
command runs in a fresh one and its `cpu.stat` gives the CPU time of the whole tree; processes in
other pid namespaces (bwrap) are counted like any other. Otherwise the figure is RUSAGE_CHILDREN,
which misses what bwrap's containers used (`how` says which).
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from dataclasses import dataclass

from trex.workloads.sandbox.cgroups import probe


@dataclass(frozen=True)
class Metered:
    wall_s: float
    cpu_s: float
    how: str  # "cgroup" or "rusage (bubblewrap containers not counted)"
    returncode: int


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def metered(argv: list[str], **popen) -> Metered:
    support = probe()
    directory = None
    if support.parent is not None:
        directory = os.path.join(support.parent, f"trex-measure-{os.getpid()}-{time.monotonic_ns()}")
        try:
            os.mkdir(directory)
        except OSError:
            directory = None
    started, children_before = time.monotonic(), _children_cpu()
    if directory is None:
        returncode = subprocess.call(argv, **popen)
        return Metered(
            time.monotonic() - started,
            _children_cpu() - children_before,
            "rusage (bubblewrap containers not counted)",
            returncode,
        )
    command = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', directory, *argv]
    returncode = subprocess.call(command, **popen)
    wall = time.monotonic() - started
    with open(os.path.join(directory, "cpu.stat"), encoding="ascii") as stat:
        usage = dict(line.split() for line in stat if line.strip())
    for current, _, _ in sorted(os.walk(directory), key=lambda entry: -len(entry[0])):
        for _ in range(200):  # a process leaves its cgroup a moment after it is reaped
            try:
                os.rmdir(current)
                break
            except OSError:
                time.sleep(0.05)
    return Metered(wall, int(usage["usage_usec"]) / 1e6, "cgroup", returncode)
