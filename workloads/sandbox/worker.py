"""Warm sandbox worker: solver libraries imported once, one fresh forked child per program.

    python -I -B worker.py CONFIG_JSON          (inside bubblewrap, or in a session of its own)

Starting an interpreter and importing pyscipopt/coptpy costs about half a second, far more than
a benchmark-size program needs to run. A worker pays it once: it imports the solver libraries it
is asked to preload (those of `PRELOAD` by default, where installed), compiles the seccomp filter,
then serves requests, one JSON line each on its stdin, answering one JSON line each on its stdout:

    request  {"id": 7, "source": "...", "files": {"model.lp": "..."}, "limits": {...}, "env": {...}}
    answer   {"id": 7, "exit": 0, "cpu_s": 0.03, "max_rss_bytes": ..., "wall_s": 0.05, "timed_out": false}

For each request it forks a child that becomes the program: a session of its own, a fresh work
directory (its cwd, HOME and TMPDIR) holding only the program and its files, stdout/stderr/events
in files of the run's io directory, the run's environment, rlimits, a uid of its own where the
worker may switch uids (root), no_new_privs, a parent-death signal, the seccomp filter, the
recorders and the audit-hook guard. The parent waits up to the wall-clock limit, kills the
child's process group, then every other process the program left (the whole pid namespace but
itself under bubblewrap, the processes carrying the run's token otherwise), removes the work
directory and answers. One program runs at a time per worker, so a program never meets another
program's files or processes; its memory is its own copy-on-write copy of the worker's.

Runs inside the sandbox (copied next to the bootstrap): standard library, its siblings, pyseccomp.
"""

from __future__ import annotations

import base64
import gc
import importlib
import json
import os
import resource
import select
import shutil
import signal
import stat
import sys
import time

# Every fork copies the worker's page tables and every exit tears them down: with all of these
# loaded a fork-and-exit costs about 3x what it costs with pyscipopt alone (18 ms against 6 ms
# measured here), so callers that know their programs' solver preload only that one
# (`Sandbox(preload=...)`); a program importing another library still works, it pays the import.
# gurobipy is left out: its size-limited licence is checked against the identity of the process
# that imported it, and a program's uid differs from its worker's.
PR_SET_DUMPABLE = 4
EVENTS_FD, SETUP_FD = 3, 4  # a child's descriptors: 0-2 standard streams, then these, nothing else
PRELOAD = ("pyscipopt", "coptpy", "highspy", "pulp", "pyomo.environ")


def _load_sibling(name: str):
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_trex_sandbox_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bootstrap = _load_sibling("bootstrap")
launcher = _load_sibling("launcher")  # rlimits, the uid's task count, prctl
seccomp_filter = _load_sibling("seccomp_filter")
for _name in ("recorders", "guard"):  # before any fork: a program's uid may not read the runtime directory
    _load_sibling(_name)


class Worker:
    def __init__(self, config: dict):
        self.config = config
        self.preloaded = []
        for name in config.get("preload", PRELOAD):
            try:
                with open(os.devnull, "w") as quiet:  # licence banners go nowhere
                    saved = os.dup(1)
                    os.dup2(quiet.fileno(), 1)
                    try:
                        importlib.import_module(name)
                    finally:
                        os.dup2(saved, 1)
                        os.close(saved)
                self.preloaded.append(name)
            except Exception:  # noqa: BLE001 - not installed, or fails to load: programs import it themselves
                continue
        # what every program's bootstrap needs (its failure path, the guard, __main__), loaded once here
        # instead of in each child
        for name in ("traceback", "types", "ctypes"):
            importlib.import_module(name)
        self.filter = None
        self.seccomp_error = None
        if config["seccomp"]:
            self.seccomp_error = seccomp_filter.available()
            if self.seccomp_error is None:
                # compiled to BPF once here; each child installs the same instructions
                self.filter = seccomp_filter.Compiled(seccomp_filter.build((os.getpid(), os.getppid())))
        self.switch_uid = config["uid_base"] is not None
        self.baseline_vm = _mapped_bytes()
        self.in_pid_namespace = config["pid_namespace"]
        # everything loaded so far is shared with every child: frozen objects are never visited by
        # the collector, so a child's garbage collections do not copy the worker's pages
        gc.freeze()

    # -- one program -------------------------------------------------------------------------

    def run(self, request: dict) -> dict:
        run_id = int(request["id"])
        work_dir = os.path.join(self.config["work_root"], f"run-{run_id}")
        io_dir = os.path.join(self.config["io_root"], f"run-{run_id}")
        uid = self.config["uid_base"] + run_id % 10_000 if self.switch_uid else None
        limits = request["limits"]
        opened = [
            os.open(os.path.join(io_dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            for name in ("stdout", "stderr", "events.jsonl", "setup_error")
        ]
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            self._child(request, work_dir, io_dir, opened, uid)  # never returns
        for fd in opened:
            os.close(fd)
        timed_out = not _wait(pid, limits["wall_s"])
        if timed_out:
            _kill_group(pid)
        _, wait_status, usage = os.wait4(pid, 0)
        wall = time.monotonic() - started
        _kill_group(pid)
        self._kill_leftovers(request["env"].get("TREX_SANDBOX_TOKEN", ""))
        answer: dict = {
            "id": run_id,
            "timed_out": timed_out,
            "wall_s": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "max_rss_bytes": usage.ru_maxrss * 1024,
        }
        if os.WIFSIGNALED(wait_status):
            answer["signal"] = os.WTERMSIG(wait_status)
        else:
            answer["exit"] = os.WEXITSTATUS(wait_status)
        with open(os.path.join(io_dir, "setup_error"), encoding="utf-8", errors="replace") as file:
            setup_error = file.read()[:2000]
        if setup_error:
            answer["setup_error"] = setup_error
        _remove_tree(work_dir)
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        # everything this worker has used so far, start-up and its programs included
        answer["worker_cpu_s"] = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
        return answer

    def _child(self, request: dict, work_dir: str, io_dir: str, opened: list[int], uid: int | None) -> None:
        try:
            os.setsid()
            stdout, stderr, events_fd, setup_fd = opened
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(stdout, 1)
            os.dup2(stderr, 2)
            os.dup2(events_fd, EVENTS_FD)
            os.dup2(setup_fd, SETUP_FD)
            opened[3] = SETUP_FD
            os.closerange(SETUP_FD + 1, 1 << 16)  # the worker's request and answer channels above all
            os.mkdir(work_dir, 0o700)
            _write_inputs(work_dir, request)
            if uid is not None:
                # files before their directory: without CAP_DAC_OVERRIDE a 0700 directory handed to
                # the uid can no longer be entered
                for directory, _subdirectories, names in os.walk(work_dir, topdown=False):
                    for name in names:
                        os.chown(os.path.join(directory, name), uid, uid)
                    os.chown(directory, uid, uid)
            os.environ.clear()
            os.environ.update(request["env"])
            os.environ.update({"HOME": work_dir, "TMPDIR": work_dir})
            limits = request["limits"]
            if uid is not None:
                nproc = limits["max_processes"]
            else:
                me = os.getuid()
                nproc = None if me == 0 else launcher._tasks_of_uid(me) + limits["max_processes"]
            # address space: the program's own allowance on top of what the worker had mapped
            launcher._set_limits({**limits, "memory_bytes": limits["memory_bytes"] + self.baseline_vm}, nproc)
            if uid is not None:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                # a uid change without execve leaves the process non-dumpable: its /proc/self files
                # would belong to root and the program could not use them as it would anywhere else
                launcher.linux.prctl(PR_SET_DUMPABLE, 1)
            os.chdir(work_dir)  # after the uid switch: the directory is the program's, mode 0700
            launcher.linux.prctl(launcher.linux.PR_SET_NO_NEW_PRIVS, 1)
            launcher.linux.prctl(launcher.linux.PR_SET_PDEATHSIG, signal.SIGKILL)
            sys.stdin = open(0, encoding="utf-8", closefd=False)
            sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
            events = bootstrap._Events(EVENTS_FD)
            policy = self.config["policy"]
            config = {
                "record_solvers": self.config["record_solvers"],
                "guard": self.config["guard"],
                "allow_fork": self.config["allow_fork"],
                "policy": {**policy, "read_allow": [*policy["read_allow"], work_dir], "write_roots": [work_dir]},
            }
        except BaseException as error:  # noqa: BLE001 - the sandbox failed, not the program
            try:
                os.write(opened[3], f"{type(error).__name__}: {error}".encode(errors="replace"))
            finally:
                os._exit(launcher.SETUP_FAILED)
        os.close(SETUP_FD)  # the program runs in this process: it must not be able to write setup errors
        code = 1
        try:
            code = bootstrap.run_program(
                request["source"], events, config, confine=None if self.filter is None else self.filter.install
            )
        except SystemExit as exit_:
            code = _exit_code(exit_.code)
        except BaseException:  # noqa: BLE001 - reported like an uncaught exception of the program
            code = 1
        try:
            import atexit

            atexit._run_exitfuncs()  # the coptpy recorder reports at exit; so may the program
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)

    def _kill_leftovers(self, token: str) -> None:
        """Processes the program left behind (daemonized, or escaped its group): in a pid
        namespace of our own, everything but us and our ancestors; otherwise the run's token."""
        me, parent = os.getpid(), os.getppid()
        marker = f"TREX_SANDBOX_TOKEN={token}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in (me, parent, 1):
                continue
            try:
                if not self.in_pid_namespace:
                    with open(f"/proc/{entry}/environ", "rb") as environ:
                        if marker not in environ.read().split(b"\0"):
                            continue
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:  # reap what was re-parented to us
                pass
        except ChildProcessError:
            pass


def _mapped_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:  # noqa: BLE001
        pass
    return 1


def _write_inputs(work_dir: str, request: dict) -> None:
    with open(os.path.join(work_dir, "program.py"), "w", encoding="utf-8") as file:
        file.write(request["source"])
    for name, content in request.get("files", {}).items():
        target = os.path.join(work_dir, *name.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if isinstance(content, dict):
            with open(target, "wb") as file:
                file.write(base64.b64decode(content["base64"]))
        else:
            with open(target, "w", encoding="utf-8") as file:
                file.write(content)


def _wait(pid: int, timeout: float) -> bool:
    """False when `pid` is still running after `timeout` seconds."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    return bool(ready)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_tree(path: str) -> None:
    def make_writable(function, failed_path, _exc_info):
        try:
            os.chmod(os.path.dirname(failed_path), stat.S_IRWXU)
            os.chmod(failed_path, stat.S_IRWXU)
            function(failed_path)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable)


def main() -> None:
    config = json.loads(sys.argv[1])
    launcher.linux.prctl(launcher.linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the evaluator decides when programs stop
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # nothing a solver prints while loading reaches the answer channel
    worker = Worker(config)
    answers.write(
        json.dumps(
            {
                "ready": True,
                "preloaded": worker.preloaded,
                "seccomp": worker.filter is not None,
                "seccomp_error": worker.seccomp_error,
            }
        )
        + "\n"
    )
    answers.flush()
    for line in requests:
        try:
            request = json.loads(line)
            answer = worker.run(request)
        except Exception as error:  # noqa: BLE001 - answer, and stay up for the next program
            answer = {
                "id": request.get("id") if isinstance(request, dict) else None,
                "setup_error": f"worker: {type(error).__name__}: {error}",
            }
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
