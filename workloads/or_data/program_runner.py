"""Running pyscipopt programs (ours and teachers') in the sandbox, solving LP files, and reading
their outcome.

Every program the pipeline emits or judges runs in `trex.workloads.sandbox.Sandbox`, the same
one the OR evaluator uses. LP files are data, not code: they are read and solved in-process by
SCIP (size-limited, its reader's complaints silenced). Results are cached by the SHA-256 of the
program (with its input files) or LP text: both are deterministic (single-threaded SCIP, no clock
or randomness), so judging a sample whose program the verifier already ran does not run it again.

A program's wall-clock and CPU limits are containment, not a verdict on the programs this pipeline
writes itself (the verified program, its translations, the mutated programs of repair tasks):
they finish in well under a second, so one that ends on a clock limit says the machine was slow or
loaded (a 200-sample run niced at load 18 saw one take 30 s), and recording it would make the
samples of a seed depend on the machine. Those runs (`run(..., clock_verdict=False)`) are run again
with `CLOCK_RETRY_FACTOR` times the clocks, up to `clock_retries` times, and if the last attempt
still ends on a clock they raise `ClockLimitReached`: nothing is recorded for the shard, and a rerun
resumes it. Either way the outcome recorded is the one the program reached by itself. A teacher's
(model-written) program that ends on a clock limit is that program's failure, as in the OR evaluator.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace

from trex.workloads.or_data.outcome import Outcome, outcome_from_run
from trex.workloads.or_data.solve import STATUSES, descriptor_to_devnull, solve_lp_text_scip
from trex.workloads.sandbox import FailureKind, Limits, Sandbox
from trex.workloads.sandbox.interruption import RunIncomplete, SandboxFailed

# Generated instances solve in well under a second; teachers' programs get the same room.
DEFAULT_LIMITS = Limits(wall_s=30.0, cpu_s=30.0, memory_bytes=2 << 30)
_CACHE_SIZE = 512
PRELOAD = ("pyscipopt", "pulp", "pyomo.environ", "coptpy")
# Programs run in one of two warm workers, by the libraries they import: Pyomo makes every fork of
# a worker that preloaded it about 40% dearer (a pyscipopt program: 28.7 against 20.4 CPU ms, see
# bench/RESULTS.md section 6), and most programs (the CPT instance's, every mutated repair
# program, 60% of the translations) never import it. Each group's worker preloads what its
# programs use; a program importing something else still runs (it imports it in its own child).
# The Pyomo programs solve with `SolverFactory("appsi_highs")`, which imports highspy on first use:
# preloaded, that import is paid once per worker instead of once per program (a Pyomo program's
# sandbox-side CPU 41 -> 26 ms, bench/RESULTS.md section 6, ninth session). PuLP imports highspy
# itself, so the `base` group has it already. Importing highspy starts no thread (HiGHS starts its
# scheduler's threads on the first solve, which a worker never runs), so forking stays safe.
POOLS = {"base": ("pyscipopt", "pulp", "coptpy"), "pyomo": ("pyscipopt", "pyomo.environ", "highspy")}
_PYOMO_IMPORT = re.compile(r"^\s*(?:import|from)\s+pyomo\b", re.M)
MAX_LP_CHARS = 400_000
CLOCK_LIMITS = (FailureKind.TIMEOUT, FailureKind.CPU_LIMIT)
CLOCK_RETRIES = 2
CLOCK_RETRY_FACTOR = 4.0
_CLOCK_FAILURES = {kind.value for kind in CLOCK_LIMITS}


class ClockLimitReached(RunIncomplete):
    """A program the pipeline wrote itself ended on a wall-clock or CPU-time limit: the machine's
    speed, not the program, decided the outcome, so it is not recorded (see the module docstring)."""


def pool_for(source: str) -> str:
    """The warm worker group (`POOLS`) a program runs in."""
    return "pyomo" if _PYOMO_IMPORT.search(source) else "base"


@dataclass(frozen=True)
class ProgramRun:
    """A program's outcome, or why it has none (`failure`: a sandbox failure kind or
    `no_objective`)."""

    outcome: Outcome | None
    failure: str | None
    detail: str
    stdout: str
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome is not None


class ProgramRunner:
    """Runs programs in a sandbox it owns (created on first use) and caches their outcomes.
    `runs` counts programs actually executed, `hits` the answers served from the cache."""

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        isolation: str = "auto",
        hide: tuple[str, ...] = (),
        clock_retries: int = CLOCK_RETRIES,
    ):
        self.limits = limits if limits is not None else DEFAULT_LIMITS
        self.isolation, self.hide, self.clock_retries = isolation, hide, clock_retries
        self._sandboxes: dict[str, Sandbox] = {}
        self._cache: OrderedDict[str, ProgramRun] = OrderedDict()
        self.runs = 0
        self.hits = 0

    def sandbox_for(self, pool: str = "base") -> Sandbox:
        """The sandbox of worker group `pool` (`POOLS`), started on first use. One program at a time
        per runner (each synthesis worker process has its own), so one warm worker per group."""
        sandbox = self._sandboxes.get(pool)
        if sandbox is None:
            sandbox = Sandbox(self.limits, isolation=self.isolation, hide=self.hide, workers=1, preload=POOLS[pool])
            self._sandboxes[pool] = sandbox
        return sandbox

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox most programs run in (the `base` group)."""
        return self.sandbox_for("base")

    @property
    def worker_cpu_s(self) -> float:
        """CPU seconds of every warm worker this runner started (`Sandbox.worker_cpu_s`)."""
        return sum(sandbox.worker_cpu_s for sandbox in self._sandboxes.values())

    def run(self, source: str, files: Mapping[str, str] | None = None, *, clock_verdict: bool = True) -> ProgramRun:
        """The program's outcome. `clock_verdict=False` for programs the pipeline wrote: a run that
        ends on a clock limit raises `ClockLimitReached` instead of being recorded."""
        files = dict(files or {})
        digest = hashlib.sha256(
            "\0".join([source, *(f"{k}\0{v}" for k, v in sorted(files.items()))]).encode()
        ).hexdigest()
        cached = self._cache.get(digest)
        if cached is not None and (clock_verdict or cached.failure not in _CLOCK_FAILURES):
            self._cache.move_to_end(digest)
            self.hits += 1
            return cached
        sandbox, limits = self.sandbox_for(pool_for(source)), self.limits
        execution = sandbox.run(source, files=files)  # an interrupted run raises RunInterrupted
        self.runs += 1
        for _ in range(0 if clock_verdict else self.clock_retries):
            if execution.failure not in CLOCK_LIMITS:
                break
            limits = replace(limits, wall_s=limits.wall_s * CLOCK_RETRY_FACTOR, cpu_s=limits.cpu_s * CLOCK_RETRY_FACTOR)
            execution = sandbox.run(source, files=files, limits=limits)
            self.runs += 1
        if execution.failure is FailureKind.SANDBOX_ERROR:
            # not the program's outcome: recording it would reject a sample for the sandbox's fault
            raise SandboxFailed(f"the sandbox could not run a program: {execution.detail}")
        if execution.failure in CLOCK_LIMITS and not clock_verdict:
            raise ClockLimitReached(
                f"a program this pipeline wrote ended on a clock limit ({execution.failure.value}: {execution.detail}) "
                f"after {execution.wall_s:.1f} s, {self.clock_retries + 1} times with ever larger limits; it "
                "finishes in well under a second on an idle machine, so the machine is too loaded for an outcome "
                "that does not depend on its speed. Nothing is recorded for this shard: run the same command "
                "again to resume"
            )
        if execution.failure is not None:
            result = ProgramRun(None, execution.failure.value, execution.detail, execution.stdout, execution.wall_s)
        else:
            outcome = outcome_from_run(execution.stdout, execution.solves)
            failure = None if outcome is not None else "no_objective"
            detail = "" if outcome is not None else "ran, but printed and solved no objective"
            result = ProgramRun(outcome, failure, detail, execution.stdout, execution.wall_s)
        self._remember(digest, result)
        return result

    def solve_lp(self, lp_text: str) -> ProgramRun:
        """The outcome of an LP file (read and solved by SCIP in this process)."""
        digest = "lp:" + hashlib.sha256(lp_text.encode()).hexdigest()
        cached = self._cache.get(digest)
        if cached is not None:
            self.hits += 1
            return cached
        if len(lp_text) > MAX_LP_CHARS:
            result = ProgramRun(
                None, "lp_too_large", f"the LP file has {len(lp_text)} characters, more than {MAX_LP_CHARS}", ""
            )
        else:
            try:
                with descriptor_to_devnull(2):
                    solved = solve_lp_text_scip(lp_text)
            except OSError as error:
                result = ProgramRun(None, "lp_read_error", f"SCIP cannot read the LP file ({error})", "")
            else:
                if solved.status in STATUSES:
                    result = ProgramRun(Outcome(solved.status, solved.objective), None, "", "")
                else:
                    result = ProgramRun(None, "lp_not_solved", f"SCIP ends with status {solved.solver_status}", "")
        self._remember(digest, result)
        return result

    def _remember(self, digest: str, result: ProgramRun) -> None:
        self._cache[digest] = result
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)

    def abort(self) -> None:
        """Stop the program in flight (Ctrl-C); its run raises `RunInterrupted`."""
        for sandbox in list(self._sandboxes.values()):
            sandbox.abort()

    def close(self) -> None:
        sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        for sandbox in sandboxes:
            sandbox.close()

    def __enter__(self) -> ProgramRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
