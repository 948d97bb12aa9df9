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

Each run gets a fresh interpreter, a fresh work directory (its cwd, HOME and TMPDIR), resource
limits (`Limits`: CPU time, wall time, address space, file size, processes, open files), the
installed solvers (pyscipopt; coptpy, gurobipy, pulp, highspy, pyomo where installed) and solver
recorders that report each solve's status and objective. Two isolation levels
(`trex.workloads.sandbox.isolation`): `os` (root on Linux: namespaces, read-only mounts with the
evaluator's files masked, a uid of its own, no network at all) is the security boundary; `process`
(any user: limits plus an audit-hook guard) contains mistakes and naive hostile code only. Both
levels run the same guard, so forbidden actions fail the same way and are reported as a
`FailureKind` (`file_denied`, `network_denied`, `process_limit`, `signal_denied`, ...).

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
