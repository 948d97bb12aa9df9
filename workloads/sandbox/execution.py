"""What running one program produced, and how its failure is classified."""

from __future__ import annotations

import errno as errno_codes
import json
import signal
from dataclasses import asdict, dataclass, field
from enum import Enum

from trex.workloads.sandbox.seccomp_filter import denied_call


class FailureKind(str, Enum):
    """Why a program did not produce a usable result. The value is the name reports use."""

    SYNTAX_ERROR = "syntax_error"
    RUNTIME_ERROR = "runtime_error"  # uncaught exception or non-zero exit
    TIMEOUT = "timeout"  # wall-clock limit
    CPU_LIMIT = "cpu_limit"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"  # file-size limit (stdout and stderr included)
    PROCESS_LIMIT = "process_limit"  # fork, shell, or too many processes/threads
    NETWORK_DENIED = "network_denied"
    FILE_DENIED = "file_denied"  # read or write outside the allowed paths
    SIGNAL_DENIED = "signal_denied"  # signalling a process outside the sandbox
    SYSCALL_DENIED = "syscall_denied"  # refused by the seccomp filter (the detail names the call)
    FORBIDDEN = "forbidden"  # another forbidden call (e.g. loading libc with ctypes)
    KILLED = "killed"  # terminated by a signal not explained by a limit
    SANDBOX_ERROR = "sandbox_error"  # the sandbox itself failed; not the program's fault

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SolveRecord:
    """One solve the program performed, as a solver recorder saw it."""

    api: str
    status: str  # optimal, infeasible, unbounded, infeasible_or_unbounded, or the solver's word
    objective: float | None  # set when status is optimal


@dataclass(frozen=True)
class Execution:
    """The outcome of one sandboxed run. `failure is None` means it exited 0 within its limits."""

    failure: FailureKind | None
    detail: str  # one line a person can act on ("" on success)
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    solves: tuple[SolveRecord, ...] = ()
    violations: tuple[str, ...] = ()
    wall_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_bytes: int = 0
    isolation: str = ""
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def last_solve(self) -> SolveRecord | None:
        return self.solves[-1] if self.solves else None

    def to_json(self) -> dict:
        data = asdict(self)
        data["failure"] = None if self.failure is None else self.failure.value
        return data


@dataclass
class RawOutcome:
    """What the sandbox observed, before classification."""

    timed_out: bool
    exit_code: int | None
    signal: int | None
    cpu_s: float
    stderr: str
    events: list[dict]
    setup_error: str | None
    limits_cpu_s: float
    limits_memory_bytes: int
    oom_detail: str | None = None  # set when the cgroup's memory.max killed a process of the run


_NETWORK_ERRNOS = {errno_codes.ENETUNREACH, errno_codes.ENETDOWN, errno_codes.EHOSTUNREACH, errno_codes.ECONNREFUSED}
_VIOLATION_KINDS = {kind.value: kind for kind in FailureKind}


def parse_events(text: str) -> list[dict]:
    """The events a program's bootstrap wrote; lines that are not JSON objects are ignored
    (the program shares the descriptor and may have written garbage)."""
    events = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("event"), str):
            events.append(event)
    return events


def solves_from(events: list[dict]) -> tuple[SolveRecord, ...]:
    solves = []
    for event in events:
        if event["event"] != "solve":
            continue
        objective = event.get("objective")
        if not isinstance(objective, (int, float)) or isinstance(objective, bool):
            objective = None
        solves.append(SolveRecord(api=str(event.get("api")), status=str(event.get("status")), objective=objective))
    return tuple(solves)


def classify(raw: RawOutcome) -> tuple[FailureKind | None, str]:
    """The failure kind and a one-line explanation; the first rule that applies wins.

    Order matters: a sandbox setup failure is never blamed on the program; a wall-clock kill
    explains any signal; a violation explains whatever the program did after it.
    """
    if raw.setup_error is not None:
        return FailureKind.SANDBOX_ERROR, f"sandbox setup failed: {raw.setup_error}"
    if raw.timed_out:
        return FailureKind.TIMEOUT, "killed at the wall-clock limit"
    for event in raw.events:
        if event["event"] == "violation" and event.get("kind") in _VIOLATION_KINDS:
            return _VIOLATION_KINDS[event["kind"]], str(event.get("detail", ""))
    sig = raw.signal
    if sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if raw.oom_detail is not None and sig == signal.SIGKILL:
            return FailureKind.MEMORY_LIMIT, raw.oom_detail
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and raw.cpu_s >= raw.limits_cpu_s - 0.05):
            return FailureKind.CPU_LIMIT, f"used {raw.cpu_s:.1f} s of CPU, the limit is {raw.limits_cpu_s:g} s"
        if sig == signal.SIGXFSZ:
            return FailureKind.OUTPUT_LIMIT, "wrote more than the file-size limit"
        if _mentions_memory(raw.stderr):
            return (
                FailureKind.MEMORY_LIMIT,
                f"ran out of its {raw.limits_memory_bytes >> 20} MiB address space ({name})",
            )
        return FailureKind.KILLED, f"terminated by {name}"
    for event in raw.events:
        if event["event"] == "syntax_error":
            return FailureKind.SYNTAX_ERROR, f"line {event.get('line')}: {event.get('message')}"
    for event in raw.events:
        if event["event"] == "exception":
            return _classify_exception(event, raw)
    if raw.exit_code:
        if _mentions_memory(raw.stderr):
            return FailureKind.MEMORY_LIMIT, f"ran out of its {raw.limits_memory_bytes >> 20} MiB address space"
        return FailureKind.RUNTIME_ERROR, f"exited with status {raw.exit_code}"
    return None, ""


def _classify_exception(event: dict, raw: RawOutcome) -> tuple[FailureKind, str]:
    kind, message, code = event.get("type", ""), event.get("message", ""), event.get("errno")
    text = f"{kind}: {message}"
    call = denied_call(code)
    if call is not None:
        return FailureKind.SYSCALL_DENIED, f"the seccomp filter denied {call}() ({kind})"
    if code == errno_codes.ENOSPC:
        return FailureKind.OUTPUT_LIMIT, f"the work directory is full ({text})"
    if kind == "MemoryError":
        return (
            FailureKind.MEMORY_LIMIT,
            f"MemoryError under the {raw.limits_memory_bytes >> 20} MiB address-space limit",
        )
    if code == errno_codes.EAGAIN and kind in ("BlockingIOError", "OSError"):
        return FailureKind.PROCESS_LIMIT, text  # fork/clone refused by RLIMIT_NPROC
    if code == errno_codes.EFBIG:
        return FailureKind.OUTPUT_LIMIT, text
    if code in _NETWORK_ERRNOS or kind == "gaierror":
        return FailureKind.NETWORK_DENIED, text
    if code in (errno_codes.EROFS, errno_codes.EACCES):
        return FailureKind.FILE_DENIED, text
    return FailureKind.RUNTIME_ERROR, text


def _mentions_memory(stderr: str) -> bool:
    tail = stderr[-4000:]
    return any(
        marker in tail for marker in ("MemoryError", "std::bad_alloc", "Cannot allocate memory", "out of memory")
    )
