"""Which isolation the machine allows, and which paths the sandboxed interpreter needs or must not see.

Three levels:

- `bwrap` (any user where bubblewrap runs; the default): warm workers in bubblewrap containers
  (`trex.workloads.sandbox.bwrap`), a uid per program when running as root, the seccomp filter.
- `namespaces` (called `os` before; the fallback where bwrap cannot run): needs root
  (CAP_SYS_ADMIN) on Linux. One fresh interpreter per program, in fresh pid, network, mount,
  IPC and UTS namespaces under a uid of its own (1_500_000_000 + the launcher's pid). It sees
  the system directories (`VISIBLE_ROOTS`: /usr, /lib*, /bin, /sbin, /etc, /proc, /sys, /dev),
  the interpreter with its packages, and its work directory; every other top-level directory is
  masked, as are the evaluator's installation and the paths the caller hides, even inside what
  stays visible. Every mount is read-only except the work directory; /proc shows only the
  program's own processes; the network namespace has no interface but a downed loopback;
  RLIMIT_NPROC counts only the program's processes; signals to anything outside are refused
  by the kernel (other uid, other pid namespace). This is the security boundary for untrusted
  model-written code.
- `process`: any user. A new session and process group, resource limits, a scrubbed
  environment, its own work directory, and the audit-hook guard. It contains mistakes and naive
  hostile code; it is not a boundary against code written to escape an audit hook.

`auto` picks `bwrap` when its probe succeeds, else `namespaces` when that probe succeeds, else
`process`. Every level loads the seccomp filter (`seccomp_filter`) where libseccomp is present.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from trex.workloads.sandbox.interpreter import InterpreterPaths, minimal_roots  # noqa: F401 - re-exported
from trex.workloads.sandbox.limits import SandboxConfigError

ISOLATION_LEVELS = ("auto", "bwrap", "namespaces", "process")
ISOLATION_ALIASES = {"os": "namespaces"}
UID_BASE = 1_500_000_000
WARM_UID_BASE = 1_600_000_000


def warm_uid_base(slot: int) -> int:
    """First uid of a warm worker's programs (each gets `base + run % 10_000`): distinct per
    evaluator process and worker slot, and apart from the cold launcher's `UID_BASE + pid`."""
    return WARM_UID_BASE + (os.getpid() % 20_000) * 100_000 + slot * 10_000


_probe_lock = threading.Lock()
_probe_cache: dict[str, str | None] = {}


def evaluator_paths() -> tuple[str, ...]:
    """The trex installation a program must not read: the source checkout for an editable
    install (the folder holding pyproject.toml), otherwise the installed package directories."""
    import trex
    import trex.workloads

    paths = set()
    for package in (trex, trex.workloads):
        directory = Path(package.__file__).resolve().parent
        checkout = directory.parent
        if (checkout / "pyproject.toml").exists() or (checkout / ".git").exists():
            paths.add(str(checkout))
        else:
            paths.add(str(directory))
    return tuple(sorted(paths))


def canonical_isolation(requested: str) -> str:
    """`requested` with aliases resolved ("os" is the old name of "namespaces"); raises if unknown."""
    level = ISOLATION_ALIASES.get(requested, requested)
    if level not in ISOLATION_LEVELS:
        raise SandboxConfigError(f"unknown isolation {requested!r}; valid: {', '.join(ISOLATION_LEVELS)}")
    return level


def resolve_isolation(requested: str, launcher: str, python: InterpreterPaths, work_base: str) -> str:
    """The isolation level to use; raises when a level is requested by name and unavailable."""
    from trex.workloads.sandbox.bwrap import bwrap_unavailable

    requested = canonical_isolation(requested)
    if requested == "process":
        return "process"
    if requested in ("auto", "bwrap"):
        reason = bwrap_unavailable(python.executable)
        if reason is None:
            return "bwrap"
        if requested == "bwrap":
            raise SandboxConfigError(
                f"bwrap isolation is unavailable: {reason}. Use isolation='namespaces' (root) or 'process' "
                "(not a boundary against deliberately hostile code)"
            )
    reason = os_isolation_unavailable(launcher, python, work_base)
    if reason is None:
        return "namespaces"
    if requested == "namespaces":
        raise SandboxConfigError(
            f"namespaces isolation is unavailable: {reason}. Run the evaluator as root on Linux, "
            "or use isolation='bwrap' or 'process' (not a boundary against deliberately hostile code)"
        )
    return "process"


def os_isolation_unavailable(launcher: str, python: InterpreterPaths, work_base: str) -> str | None:
    """None when `os` isolation works here, else why not (probed once per interpreter)."""
    if not sys.platform.startswith("linux"):
        return f"needs Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return f"needs root (namespaces, mounts, a separate uid); running as uid {os.geteuid()}"
    with _probe_lock:
        if python.executable not in _probe_cache:
            _probe_cache[python.executable] = _probe(launcher, python, work_base)
        return _probe_cache[python.executable]


def _probe(launcher: str, python: InterpreterPaths, work_base: str) -> str | None:
    read_fd, write_fd = os.pipe()
    config = {
        "mode": "probe",
        "status_fd": write_fd,
        "parent_pid": os.getpid(),
        "needed": list(python.needed),
        "work_dir": work_base,
        "uid_base": UID_BASE,
        "argv": [python.executable],
    }
    try:
        process = subprocess.run(
            [python.executable, "-I", "-S", launcher, json.dumps(config)],
            pass_fds=(write_fd,),
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"probe failed to start: {error}"
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as status:
        lines = status.read().decode(errors="replace").splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    if any(record.get("probe") for record in records):
        return None
    errors = [record["setup_error"] for record in records if "setup_error" in record]
    return errors[0] if errors else f"probe exited {process.returncode}: {process.stderr.strip()[-300:]}"
