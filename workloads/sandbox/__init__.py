"""Run untrusted, model-written Python programs: one fresh process each, limited, isolated, classified.

    from trex.workloads.sandbox import Limits, Sandbox

    with Sandbox(Limits(wall_s=30, memory_bytes=2 << 30), hide=["bench/answers.json"]) as sandbox:
        execution = sandbox.run(program_source, files={"model.lp": lp_text})
        if execution.ok:
            print(execution.stdout, execution.last_solve)     # SolveRecord(api, status, objective)
        else:
            print(execution.failure, execution.detail)         # e.g. FailureKind.TIMEOUT

Used by the OR evaluator (`trex.workloads.or_eval`) and meant for data-synthesis pipelines that
verify generated solver code the same way.

Each run gets a fresh process, a fresh work directory (its cwd, HOME and TMPDIR), resource
limits (`Limits`: CPU time, wall time, address space, file size, work-directory size, processes,
open files), the installed solvers (pyscipopt; coptpy, gurobipy, pulp, highspy, pyomo where
installed), solver recorders that report each solve's status and objective, a seccomp filter
(`seccomp_filter`: network, ptrace, mount, namespaces, kexec, bpf, keyrings, process-tree
escapes; a denial is reported as `syscall_denied` with the call's name) and the audit-hook guard.
Isolation levels (`trex.workloads.sandbox.isolation`, `isolation=` "auto" picks the first that
works): `bwrap` (bubblewrap containers, any user where it runs; a uid per program as root),
`namespaces` (root; the hand-made launcher, the fallback) and `process` (limits, seccomp and the
guard only: it contains mistakes and naive hostile code, not code written to escape an audit
hook). Under `bwrap` and `process` programs run in warm workers (`worker.py`, `warm.py`): the
solver libraries are imported once per worker (`preload=`: only those the programs use, since
each makes every fork slower) and each program is a fresh forked child, so a run costs
milliseconds instead of an interpreter start. Where the machine delegates cgroup v2 controllers,
each worker (and each cold run) also gets a cgroup with memory, pids and CPU limits (`cgroups`);
`Sandbox.cgroup` says what is enforced and why the rest is not. Forbidden actions fail the same way at every
level and are reported as a `FailureKind` (`file_denied`, `network_denied`, `process_limit`,
`signal_denied`, `syscall_denied`, ...). A killed evaluator leaves no process behind, and the
next `Sandbox` removes the directory and the cgroup it left (`cleanup`, `cgroups`).

A run the caller stops (`Sandbox.abort()`, e.g. on Ctrl-C) raises `RunInterrupted`: it is not an
outcome of the program and must not be recorded (`trex.workloads.sandbox.interruption`).
"""

from trex.workloads.sandbox.execution import Execution, FailureKind, SolveRecord
from trex.workloads.sandbox.interruption import RunInterrupted
from trex.workloads.sandbox.isolation import ISOLATION_LEVELS
from trex.workloads.sandbox.limits import Limits, SandboxConfigError
from trex.workloads.sandbox.sandbox import Sandbox

__all__ = [
    "ISOLATION_LEVELS",
    "Execution",
    "FailureKind",
    "Limits",
    "RunInterrupted",
    "Sandbox",
    "SandboxConfigError",
    "SolveRecord",
]
