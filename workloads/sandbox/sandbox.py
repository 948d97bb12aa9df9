"""`Sandbox`: run one untrusted Python program per fresh process, within limits, and say how it ended."""

from __future__ import annotations

import base64
import itertools
import json
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from trex.workloads.sandbox import cgroups, seccomp_filter
from trex.workloads.sandbox.cleanup import BASE_PREFIX, mark_owner, remove_abandoned_directories
from trex.workloads.sandbox.execution import Execution, FailureKind, RawOutcome, classify, parse_events, solves_from
from trex.workloads.sandbox.interruption import RunInterrupted
from trex.workloads.sandbox.isolation import (
    UID_BASE,
    InterpreterPaths,
    canonical_isolation,
    evaluator_paths,
    resolve_isolation,
    warm_uid_base,
)
from trex.workloads.sandbox.limits import Limits, SandboxConfigError
from trex.workloads.sandbox.policy import SYSTEM_READ_DENY, SYSTEM_READ_ROOTS, VISIBLE_ROOTS, PathPolicy
from trex.workloads.sandbox.warm import WarmPool, WarmWorker

# Files copied into the runtime directory: the code that runs inside the sandbox's process tree.
_RUNTIME_FILES = (
    "launcher.py",
    "linux.py",
    "policy.py",
    "bootstrap.py",
    "guard.py",
    "recorders.py",
    "seccomp_filter.py",
    "worker.py",
)
# At most this much of stdout and of stderr is kept (the end of it: objectives are printed last).
MAX_KEPT_OUTPUT = 1 << 20


class Sandbox:
    """Runs untrusted Python programs, each in a fresh interpreter, and classifies how they ended.

        with Sandbox(Limits(wall_s=30), hide=["/data/answers.json"]) as sandbox:
            execution = sandbox.run(source)
            execution.failure        # None, or a FailureKind such as TIMEOUT or FILE_DENIED
            execution.last_solve     # SolveRecord(api="pyscipopt", status="optimal", objective=...)

    `hide` adds paths the program must not read to the evaluator's own installation, which is
    always hidden. `isolation` is "auto", "bwrap", "namespaces" ("os") or "process" (see
    `trex.workloads.sandbox.isolation`). Under bwrap and process, `workers` warm workers (default:
    one per core) run the programs (`warm=False` starts a fresh interpreter per program instead);
    `seccomp=False` leaves the seccomp filter out. `preload` names the solver modules a warm worker
    imports before forking (default: every one of `worker.PRELOAD` that is installed); name only
    the ones the programs use (e.g. `("coptpy",)`): each preloaded library makes every program's
    fork slower, and a program importing one that is not preloaded still works. `cgroup=False`
    leaves the cgroup-v2 limits out (`cgroups`; `cgroup` says what is enforced and why the rest is
    not). `run` is thread-safe: an evaluator runs many programs at once from a thread pool; each
    run is its own process, so threads only wait.
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        isolation: str = "auto",
        hide: Iterable[str | os.PathLike] = (),
        python: str | None = None,
        guard: bool = True,
        record_solvers: bool = True,
        allow_fork: bool = False,
        env: Mapping[str, str] | None = None,
        warm: bool = True,
        workers: int | None = None,
        seccomp: bool = True,
        preload: Iterable[str] | None = None,
        cgroup: bool = True,
    ):
        self.limits = limits or Limits()
        self.guard = guard
        self.record_solvers = record_solvers
        self.allow_fork = allow_fork
        self.extra_env = dict(env or {})
        self.seccomp = seccomp
        self.preload = None if preload is None else tuple(preload)
        for name in self.preload or ():
            if not all(part.isidentifier() for part in name.split(".")):
                raise SandboxConfigError(f"preload: {name!r} is not a module name")
        canonical_isolation(isolation)
        if workers is not None and workers < 1:
            raise SandboxConfigError(f"workers must be at least 1, got {workers}")
        remove_abandoned_directories()
        self.interpreter = InterpreterPaths.of(python or _default_python())
        self.hidden = tuple(sorted({os.path.realpath(p) for p in [*evaluator_paths(), *map(os.fspath, hide)]}))
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._aborted = False
        self._in_flight: set[int] = set()  # process groups of the runs under way
        self._pool: WarmPool | None = None
        self._cgroup: cgroups.RunCgroup | None = None
        self._base = tempfile.mkdtemp(prefix=BASE_PREFIX)
        try:
            os.chmod(self._base, 0o711)  # traversable by the sandbox uid, not listable
            mark_owner(self._base)
            self._runtime = os.path.join(self._base, "runtime")
            self._install_runtime()
            self.isolation = resolve_isolation(isolation, self._launcher, self.interpreter, self._base)
            self.seccomp_note = seccomp_filter.available() if seccomp else "the seccomp filter is off"
            self.cgroup_support = self._make_cgroup(cgroup)
            if warm and self.isolation in ("bwrap", "process"):
                self._pool = WarmPool(workers or os.cpu_count() or 1, self._start_worker)
        except BaseException:
            self.close()
            raise

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def abort(self) -> None:
        """Stop every program in flight; their runs (and any run started later) raise
        `RunInterrupted` instead of returning a result. For Ctrl-C: what was stopped is no
        outcome of the program and must be executed again by a resumed run."""
        with self._lock:
            self._aborted = True
            in_flight = list(self._in_flight)
        for pgid in in_flight:
            _kill_group(pgid)
        if self._pool is not None:
            self._pool.abort()

    def wait_ready(self) -> None:
        """Block until the warm workers have started (a no-op without them); raises what failed."""
        if self._pool is not None:
            self._pool.wait_ready()

    @property
    def worker_cpu_s(self) -> float:
        """CPU seconds the warm workers have used, their start-up and programs included (0 without
        them): a bwrap container's CPU time does not reach this process's RUSAGE_CHILDREN. Read
        from the run's cgroup where there is one (bwrap itself included), else as the workers
        reported it in their last answers."""
        if self._pool is None:
            return 0.0
        return self._cgroup.cpu_s() if self._cgroup is not None else self._pool.cpu_s

    @property
    def cgroup(self) -> str:
        """The cgroup limits of this run, for reports: what is enforced and why the rest is not."""
        return self.cgroup_support.summary()

    def _make_cgroup(self, wanted: bool) -> cgroups.CgroupSupport:
        if not wanted:
            return cgroups.CgroupSupport(None, (), "cgroup limits are off")
        support = cgroups.probe()
        if support.parent is None:
            return support
        if not os.access(cgroups.JOIN_SHELL, os.X_OK):
            return cgroups.CgroupSupport(None, (), f"no {cgroups.JOIN_SHELL} to start the workers in their cgroup")
        try:
            self._cgroup = cgroups.RunCgroup.create(support, self.limits.to_json())
        except OSError as error:
            return cgroups.CgroupSupport(None, (), f"cannot create a cgroup in {support.parent}: {error.strerror}")
        return support

    @property
    def warm(self) -> bool:
        """True when programs run in warm workers (`bwrap` and `process` isolation)."""
        return self._pool is not None

    def close(self) -> None:
        if self._in_flight:
            self.abort()  # never pull the directories from under running programs
        if getattr(self, "_pool", None) is not None:
            self._pool.close()
        if getattr(self, "_cgroup", None) is not None:
            self._cgroup.close()  # what is left of the workers' process trees, then the directories
            self._cgroup = None
        with self._lock:
            if not self._closed:
                self._closed = True
                _remove_tree(self._base)

    def __del__(self) -> None:
        try:
            if hasattr(self, "_base"):
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    @property
    def _launcher(self) -> str:
        return os.path.join(self._runtime, "launcher.py")

    def _install_runtime(self) -> None:
        os.mkdir(self._runtime, 0o755)
        source = Path(__file__).parent
        for name in _RUNTIME_FILES:
            target = os.path.join(self._runtime, name)
            shutil.copyfile(source / name, target)
            os.chmod(target, 0o644)
        empty = os.path.join(self._runtime, "masked")
        open(empty, "w").close()
        os.chmod(empty, 0o000)

    # -- running -------------------------------------------------------------------------------

    def policy_for(self, work_dir: str) -> PathPolicy:
        """What a program whose work directory is `work_dir` may read, write and execute."""
        readable = (*SYSTEM_READ_ROOTS, *self.interpreter.needed, self._runtime, work_dir)
        return PathPolicy(
            read_allow=readable,
            read_deny=(*SYSTEM_READ_DENY, *self.hidden),
            write_roots=(work_dir,),
            exec_roots=self.interpreter.site_packages,
        )

    def run(
        self,
        source: str,
        *,
        files: Mapping[str, str | bytes] | None = None,
        limits: Limits | None = None,
    ) -> Execution:
        """Run `source` as `program.py` in a fresh work directory that also holds `files`."""
        if self._closed:
            raise SandboxConfigError("this Sandbox is closed")
        if self._aborted:
            raise RunInterrupted("the sandbox was stopped (interrupted) before this program started")
        limits = limits or self.limits
        if self._pool is not None:
            return self._run_warm(next(self._counter), source, files or {}, limits)
        run_dir = os.path.join(self._base, f"run-{next(self._counter)}")
        os.mkdir(run_dir, 0o711)
        try:
            return self._run_in(run_dir, source, files or {}, limits)
        finally:
            _remove_tree(run_dir)

    def _run_in(self, run_dir: str, source: str, files: Mapping[str, str | bytes], limits: Limits) -> Execution:
        work_dir, io_dir = os.path.join(run_dir, "work"), os.path.join(run_dir, "io")
        os.mkdir(work_dir, 0o700)
        os.mkdir(io_dir, 0o700)
        program = os.path.join(work_dir, "program.py")
        Path(program).write_text(source, encoding="utf-8")
        for name, content in files.items():
            _write_input(work_dir, name, content)
        for directory, subdirectories, names in os.walk(work_dir):
            for name in subdirectories:
                os.chmod(os.path.join(directory, name), 0o755)
            for name in names:
                os.chmod(os.path.join(directory, name), 0o644)

        token = secrets.token_hex(8)
        events_path = os.path.join(io_dir, "events.jsonl")
        events_fd = os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        status_read, status_write = os.pipe()
        bootstrap_config = {
            "events_fd": events_fd,
            "seccomp": self.seccomp and self.seccomp_note is None,
            "program": program,
            "record_solvers": self.record_solvers,
            "guard": self.guard,
            "allow_fork": self.allow_fork,
            "policy": self.policy_for(work_dir).to_json(),
        }
        argv = [
            self.interpreter.executable,
            "-I",
            "-B",
            os.path.join(self._runtime, "bootstrap.py"),
            json.dumps(bootstrap_config),
        ]
        launcher_config = {
            "mode": "os" if self.isolation == "namespaces" else "process",
            "status_fd": status_write,
            "parent_pid": os.getpid(),
            "argv": argv,
            "env": self._environment(work_dir, token),
            "work_dir": work_dir,
            "limits": limits.to_json(),
            "uid_base": UID_BASE,
            "needed": [*self.interpreter.needed, self._base],
            "hide": [*self.hidden, *SYSTEM_READ_DENY, *_invisible_roots()],
            "empty_file": os.path.join(self._runtime, "masked"),
        }
        stdout_path, stderr_path = os.path.join(io_dir, "stdout"), os.path.join(io_dir, "stderr")
        command = [self.interpreter.executable, "-I", "-S", self._launcher, json.dumps(launcher_config)]
        leaf, oom_before = os.path.basename(run_dir), 0
        if self._cgroup is not None:  # a leaf of its own, limited like a worker's, removed after the run
            self._cgroup.set_limits(leaf, limits.to_json())
            oom_before = self._cgroup.oom_kills(leaf)
            command = self._cgroup.join_command(leaf, command)
        started = time.monotonic()
        try:
            with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                    pass_fds=(events_fd, status_write),
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as error:
            os.close(status_read)
            return _sandbox_error(f"cannot start the launcher: {error}", self.isolation)
        finally:
            os.close(events_fd)
            os.close(status_write)
        with self._lock:
            self._in_flight.add(process.pid)
            aborted = self._aborted
        with os.fdopen(status_read, "rb") as status_file:
            try:
                if aborted:
                    _kill_group(process.pid)
                timed_out = not _wait(process, limits.wall_s)
                if timed_out:
                    _kill_group(process.pid)
                    process.wait()
            finally:
                if process.returncode is None:  # a KeyboardInterrupt in this thread while waiting
                    _kill_group(process.pid)
                    process.wait()
                with self._lock:
                    self._in_flight.discard(process.pid)
                    aborted = self._aborted
                _kill_group(process.pid)  # stragglers a program left in its process group
                if self.isolation == "process":
                    _kill_marked(token)  # and those that left the group with setsid()
                oom = None
                if self._cgroup is not None:
                    oom = self._oom_detail(leaf, oom_before)
                    self._cgroup.remove_leaf(leaf)  # and whatever else is left of the run
            wall = time.monotonic() - started
            if aborted:
                raise RunInterrupted("the program was stopped by an interrupt before it ended; it is not a result")
            status_lines = status_file.read().decode(errors="replace").splitlines()
        status = _merge_status(status_lines)

        stdout_text = _read_tail(stdout_path)
        stderr_text = _read_tail(stderr_path)
        events = parse_events(_read_tail(events_path))
        setup_error = status.get("setup_error")
        if setup_error is None and not timed_out and "exit" not in status and "signal" not in status:
            setup_error = (
                f"the launcher ended without a status (exit {process.returncode}): {stderr_text.strip()[-300:]}"
            )
        raw = RawOutcome(
            timed_out=timed_out,
            exit_code=status.get("exit"),
            signal=status.get("signal"),
            cpu_s=float(status.get("cpu_s", 0.0)),
            stderr=stderr_text,
            events=events,
            setup_error=setup_error,
            limits_cpu_s=limits.cpu_s,
            limits_memory_bytes=limits.memory_bytes,
            oom_detail=oom,
        )
        failure, detail = classify(raw)
        return Execution(
            failure=failure,
            detail=detail,
            exit_code=raw.exit_code,
            signal=raw.signal,
            stdout=stdout_text,
            stderr=stderr_text,
            solves=solves_from(events),
            violations=tuple(str(e.get("detail", "")) for e in events if e["event"] == "violation"),
            wall_s=wall,
            cpu_s=raw.cpu_s,
            max_rss_bytes=int(status.get("max_rss_bytes", 0)),
            isolation=self.isolation,
            warnings=(*status.get("warnings", ()), *self._seccomp_warning()),
        )

    def _seccomp_warning(self) -> tuple[str, ...]:
        return () if self.seccomp_note is None else (f"no seccomp filter: {self.seccomp_note}",)

    # -- warm workers --------------------------------------------------------------------------

    def _worker_policy(self) -> dict:
        """The guard's rules for a worker's programs; the work directory is added per run."""
        policy = PathPolicy(
            read_allow=(*SYSTEM_READ_ROOTS, *self.interpreter.needed, self._runtime),
            read_deny=(*SYSTEM_READ_DENY, *self.hidden),
            write_roots=(),
            exec_roots=self.interpreter.site_packages,
        )
        return policy.to_json()

    def _start_worker(self, slot: int) -> WarmWorker:
        worker_dir = os.path.join(self._base, f"worker-{slot}")
        io_root = os.path.join(worker_dir, "io")
        os.makedirs(io_root, mode=0o711, exist_ok=True)
        os.chmod(worker_dir, 0o711)
        os.chmod(io_root, 0o711)
        bwrap = self.isolation == "bwrap"
        if bwrap:
            from trex.workloads.sandbox.bwrap import WORK_ROOT

            work_root = WORK_ROOT
        else:
            work_root = os.path.join(worker_dir, "work")
            os.makedirs(work_root, mode=0o711, exist_ok=True)
        switch_uid = bwrap and os.geteuid() == 0
        config = {
            "seccomp": self.seccomp,
            "uid_base": warm_uid_base(slot) if switch_uid else None,
            "pid_namespace": bwrap,
            "work_root": work_root,
            "io_root": io_root,
            "policy": self._worker_policy(),
            "record_solvers": self.record_solvers,
            "guard": self.guard,
            "allow_fork": self.allow_fork,
        }
        if self.preload is not None:
            config["preload"] = list(self.preload)
        worker_py = os.path.join(self._runtime, "worker.py")
        command = [self.interpreter.executable, "-I", "-B", worker_py, json.dumps(config)]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "MALLOC_ARENA_MAX": "2",
        }
        if bwrap:
            from trex.workloads.sandbox.bwrap import bwrap_binary, worker_argv

            argv = worker_argv(
                bwrap_binary(),
                needed=self.interpreter.needed,
                runtime=self._runtime,
                io_dir=io_root,
                hidden=self.hidden,
                work_bytes=self.limits.work_dir_bytes,
                env=env,
                command=command,
            )
        else:
            argv = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), *command]
        if self._cgroup is not None:
            argv = self._cgroup.join_command(f"worker-{slot}", argv)
        return WarmWorker(argv, io_root, os.path.join(worker_dir, "worker.log"), slot)

    def _run_warm(self, run_id: int, source: str, files: Mapping[str, str | bytes], limits: Limits) -> Execution:
        for name in files:
            _check_input_name(name)
        token = secrets.token_hex(8)
        request = {
            "id": run_id,
            "source": source,
            "files": {
                name: content if isinstance(content, str) else {"base64": base64.b64encode(content).decode()}
                for name, content in files.items()
            },
            "limits": limits.to_json(),
            "env": self._environment("", token),
        }
        io_dirs: list[str] = []
        leaves: list[tuple[str, int]] = []  # the worker's cgroup leaf and its OOM kills before the run

        def prepare(worker: WarmWorker) -> None:
            io_dir = os.path.join(worker.io_dir, f"run-{run_id}")
            os.mkdir(io_dir, 0o700)
            io_dirs.append(io_dir)
            if self._cgroup is not None:
                leaf = f"worker-{worker.slot}"
                self._cgroup.set_limits(leaf, limits.to_json())
                leaves.append((leaf, self._cgroup.oom_kills(leaf)))

        try:
            answer = self._pool.run(request, limits.wall_s, prepare)
            io_dir = io_dirs[0]
            status = answer.status
            stdout_text = _read_tail(os.path.join(io_dir, "stdout"))
            stderr_text = _read_tail(os.path.join(io_dir, "stderr"))
            events = parse_events(_read_tail(os.path.join(io_dir, "events.jsonl")))
        finally:
            for io_dir in io_dirs:
                _remove_tree(io_dir)
        oom = self._oom_detail(*leaves[0]) if leaves else None
        if answer.worker_died is not None:
            detail = f"{answer.worker_died}: the program took its worker down"
            return Execution(
                failure=FailureKind.KILLED if oom is None else FailureKind.MEMORY_LIMIT,
                detail=detail if oom is None else f"{oom} (it took its worker down)",
                exit_code=None,
                signal=None,
                stdout=stdout_text,
                stderr=stderr_text,
                solves=solves_from(events),
                isolation=self.isolation,
            )
        raw = RawOutcome(
            timed_out=bool(status.get("timed_out")),
            exit_code=status.get("exit"),
            signal=status.get("signal"),
            cpu_s=float(status.get("cpu_s", 0.0)),
            stderr=stderr_text,
            events=events,
            setup_error=status.get("setup_error"),
            limits_cpu_s=limits.cpu_s,
            limits_memory_bytes=limits.memory_bytes,
            oom_detail=oom,
        )
        failure, detail = classify(raw)
        return Execution(
            failure=failure,
            detail=detail,
            exit_code=raw.exit_code,
            signal=raw.signal,
            stdout=stdout_text,
            stderr=stderr_text,
            solves=solves_from(events),
            violations=tuple(str(e.get("detail", "")) for e in events if e["event"] == "violation"),
            wall_s=float(status.get("wall_s", 0.0)),
            cpu_s=raw.cpu_s,
            max_rss_bytes=int(status.get("max_rss_bytes", 0)),
            isolation=self.isolation,
            warnings=self._seccomp_warning()
            + (
                ()
                if self._pool.info.get("seccomp") or not self.seccomp
                else (f"no seccomp filter: {self._pool.info.get('seccomp_error')}",)
            ),
        )

    def _oom_detail(self, leaf: str, before: int) -> str | None:
        """Set when the cgroup's memory.max killed a process of `leaf` since `before` was read."""
        if self._cgroup is None or self._cgroup.oom_kills(leaf) <= before:
            return None
        return f"killed by the cgroup memory limit ({self._cgroup.limit_text(leaf)})"

    def _environment(self, work_dir: str, token: str) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": work_dir,
            "TMPDIR": work_dir,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            # one thread per BLAS/OpenMP pool: the evaluator already runs one program per core
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            # glibc reserves 64 MiB of address space per malloc arena and thread; cap the arenas so
            # multi-threaded solvers are not killed by the address-space limit for memory never used
            "MALLOC_ARENA_MAX": "2",
            "TREX_SANDBOX_TOKEN": token,
        }
        env.update(self.extra_env)
        return env


def _default_python() -> str:
    import sys

    return sys.executable


def _invisible_roots() -> list[str]:
    """The entries of / that `os` isolation masks (see `VISIBLE_ROOTS`)."""
    return [
        os.path.join("/", entry) for entry in sorted(os.listdir("/")) if os.path.join("/", entry) not in VISIBLE_ROOTS
    ]


def _check_input_name(name: str) -> PurePosixPath:
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts or relative.name == "program.py":
        raise SandboxConfigError(
            f"input file name {name!r} must be a relative path inside the work directory, not program.py"
        )
    return relative


def _write_input(work_dir: str, name: str, content: str | bytes) -> None:
    relative = _check_input_name(name)
    target = Path(work_dir, *relative.parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        target.write_text(content, encoding="utf-8")
    else:
        target.write_bytes(content)


def _merge_status(lines: list[str]) -> dict:
    status: dict = {"warnings": []}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "warning" in record:
            status["warnings"].append(str(record["warning"]))
        else:
            status.update(record)
    return status


def _read_tail(path: str, limit: int = MAX_KEPT_OUTPUT) -> str:
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size > limit:
                file.seek(size - limit)
            return file.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _wait(process: subprocess.Popen, timeout: float) -> bool:
    """Wait for `process` up to `timeout` seconds; False when it is still running.

    Uses a pidfd where the kernel has them: `Popen.wait(timeout)` polls with sleeps of up to
    50 ms, which would add that much latency to every program."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        try:
            process.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    if not ready:
        return False
    process.wait()
    return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_marked(token: str) -> None:
    """Kill processes (of our uid) whose environment carries this run's token: the ones a program
    moved out of its process group. Best effort: a program can also clear its environment."""
    marker = f"TREX_SANDBOX_TOKEN={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if marker in environ.read().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
        except OSError:
            continue


def _remove_tree(path: str) -> None:
    def make_writable(function, failed_path, _exc_info):  # programs may chmod their files away
        try:
            os.chmod(os.path.dirname(failed_path), stat.S_IRWXU)
            os.chmod(failed_path, stat.S_IRWXU)
            function(failed_path)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable)


def _sandbox_error(detail: str, isolation: str) -> Execution:
    return Execution(
        failure=FailureKind.SANDBOX_ERROR,
        detail=detail,
        exit_code=None,
        signal=None,
        stdout="",
        stderr="",
        isolation=isolation,
    )
