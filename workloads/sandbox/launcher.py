"""Sandbox launcher: sets up isolation and limits, then runs the sandboxed interpreter and waits.

Started by `Sandbox.run` as `python -I -S launcher.py CONFIG_JSON` in a new session. It is the
only code that runs with the evaluator's privileges inside the sandbox's process tree, and it runs
before any untrusted code. It does not import trex (it is copied into the sandbox runtime
directory), and it needs no `preexec_fn`, which is unsafe in the evaluator's threaded pool.

    launcher (evaluator's uid, outside the namespaces)
      unshare(mount, network, pid, ipc, uts)                       [os isolation only]
      fork ──► reaper = pid 1 of the new pid namespace              [os isolation only]
               private mounts: the work directory on a size-limited tmpfs,
               expose the interpreter, mask hidden paths,
               everything read-only except the work directory, fresh /proc
               fork ──► program: rlimits; a uid/gid of its own; no_new_privs;
               │                 parent-death signal; execve(python -I -B bootstrap.py ...)
               wait4(program) ──► one JSON line on the status pipe:
                                  exit code or signal, CPU time, peak RSS

Under `process` isolation the launcher forks the program itself and writes the status line.
The program is never pid 1, so signals (SIGXCPU at the CPU limit, SIGXFSZ at the file-size
limit) act on it as they would anywhere else. When the reaper exits, the kernel kills whatever
is left in its pid namespace, so no process a program started outlives it. If the launcher is
killed (the wall-clock limit kills its process group), the reaper and the program get SIGKILL
through their parent-death signals.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import sys

SETUP_FAILED = 127


def _load_sibling(name: str):
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_trex_sandbox_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


linux = _load_sibling("linux")
policy = _load_sibling("policy")


def _write_status(fd: int, record: dict) -> None:
    os.write(fd, (json.dumps(record) + "\n").encode())


def _set_limits(limits: dict, nproc: int | None) -> None:
    def both(kind: int, value: int) -> None:
        resource.setrlimit(kind, (value, value))

    cpu = max(1, int(limits["cpu_s"] + 0.999))
    # the soft limit sends SIGXCPU (fatal unless handled); the hard limit a second later SIGKILL
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    both(resource.RLIMIT_AS, limits["memory_bytes"])
    both(resource.RLIMIT_FSIZE, limits["file_size_bytes"])
    both(resource.RLIMIT_NOFILE, limits["max_open_files"])
    both(resource.RLIMIT_CORE, 0)
    if nproc is not None:
        both(resource.RLIMIT_NPROC, nproc)


def _tasks_of_uid(uid: int) -> int:
    """Threads (the unit RLIMIT_NPROC counts) that processes of `uid` have right now."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                count += len(os.listdir(f"/proc/{entry}/task"))
        except OSError:
            continue
    return count


def _first_blocked_directory(needed: list[str]) -> str | None:
    """The top-most directory on the way to a needed path that other users cannot traverse."""
    blocked = []
    for path in needed:
        parts = path.strip("/").split("/")
        for depth in range(len(parts)):  # ancestors only: the needed path keeps its own mode
            directory = "/" + "/".join(parts[:depth])
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                blocked.append(directory)
                break
    return min(blocked, key=len) if blocked else None


def _children_towards(directory: str, needed: list[str]) -> list[str]:
    """Entries of `directory` that are needed paths or lie on the way to one."""
    names = {
        path[len(directory) :].lstrip("/").split("/")[0]
        for path in needed
        if policy.is_within(path, directory) and path != directory
    }
    return [os.path.join(directory, name) for name in sorted(names)]


# Directories this launcher covered with a tmpfs: mounts below them are out of the program's view.
_covered: list[str] = []


def _cover(directory: str, keep: list[str]) -> None:
    """Replace `directory` by an empty tmpfs holding bind mounts of the entries in `keep` only."""
    _covered.append(directory)
    fds = {path: os.open(path, os.O_PATH) for path in keep}
    linux.mount("tmpfs", directory, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "mode=0755,size=64k")
    for path, fd in fds.items():
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(path)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
        linux.mount(f"/proc/self/fd/{fd}", path, None, linux.MS_BIND | linux.MS_REC)
        os.close(fd)


def _expose(needed: list[str]) -> None:
    """Make the interpreter and its packages reachable for an unprivileged uid.

    A directory on the way that other users may not traverse (e.g. /root, mode 700, holding a
    pyenv) is covered with a tmpfs that holds only the entries leading to needed paths.
    Everything else in it disappears from the program's view, which is wanted.
    """
    exposed: set[str] = set()
    while (directory := _first_blocked_directory(needed)) is not None:
        if directory in exposed:
            raise OSError(f"cannot expose {directory} to the sandbox user")
        exposed.add(directory)
        _cover(directory, _children_towards(directory, needed))


def _hide(path: str, needed: list[str], empty_file: str) -> None:
    """Make `path` unreadable, except the needed paths inside it (which stay reachable)."""
    if not os.path.lexists(path) or any(policy.is_within(path, keep) for keep in needed):
        return
    inside = _children_towards(path, needed)
    if inside:
        _cover(path, inside)
        for child in inside:
            _hide(child, needed, empty_file)
    elif os.path.isdir(path) and not os.path.islink(path):
        flags = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
        linux.mount("tmpfs", path, "tmpfs", flags, "size=4k,mode=000")
        _covered.append(path)
    elif os.path.isfile(path) and not os.path.islink(path):
        linux.mount(empty_file, path, None, linux.MS_BIND)


def _read_only_except(work_dir: str) -> list[str]:
    """Remount every mount read-only except the work directory; returns mounts that refused."""
    linux.mount(work_dir, work_dir, None, linux.MS_BIND | linux.MS_REC)
    refused = []
    for point, flags in linux.mount_points():
        if policy.is_within(point, work_dir):
            continue
        try:
            linux.mount(None, point, None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY | flags)
        except OSError as error:
            if point == "/":
                raise
            if not any(policy.is_within(point, covered) and point != covered for covered in _covered):
                refused.append(f"{point}: {error.strerror}")  # a covered mount is out of view anyway
    return refused


def _work_dir_on_tmpfs(work_dir: str, size: int) -> None:
    """Replace the work directory by a tmpfs of `size` bytes holding the same files: everything
    a program writes there together is capped (ENOSPC past it), not only each file (RLIMIT_FSIZE),
    and nothing it writes reaches the host's disk."""
    inputs = {}
    for directory, _, names in os.walk(work_dir):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as file:
                inputs[os.path.relpath(path, work_dir)] = file.read()
    flags = linux.MS_NOSUID | linux.MS_NODEV
    linux.mount("tmpfs", work_dir, "tmpfs", flags, f"size={max(size, 1 << 20)},mode=0700")
    for relative, content in inputs.items():
        path = os.path.join(work_dir, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(content)


def _isolate(config: dict, uid: int) -> None:
    """Build the program's view of the machine (runs as pid 1 of the new namespaces, as root)."""
    work_dir = config["work_dir"]
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)  # never leak to the host
    _work_dir_on_tmpfs(work_dir, config["limits"]["work_dir_bytes"])
    _expose(config["needed"])
    for path in config["hide"]:
        _hide(path, config["needed"], config["empty_file"])
    refused = _read_only_except(work_dir)
    if refused:
        _write_status(config["status_fd"], {"warning": "mounts left writable: " + "; ".join(refused)})
    linux.mount("proc", "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
    for directory, _, files in os.walk(work_dir):  # the program owns its inputs
        os.chown(directory, uid, uid)
        for name in files:
            os.chown(os.path.join(directory, name), uid, uid, follow_symlinks=False)


def _exec_program(config: dict, uid: int | None) -> None:
    """Limits, identity, then the sandboxed interpreter. Never returns."""
    os.set_inheritable(config["status_fd"], False)  # closed at execve: a program cannot forge its status
    if uid is not None:
        nproc = config["limits"]["max_processes"]
    else:
        me = os.getuid()
        # RLIMIT_NPROC counts every thread of the uid; root is exempt from it altogether
        nproc = None if me == 0 else _tasks_of_uid(me) + config["limits"]["max_processes"]
    _set_limits(config["limits"], nproc)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)  # after setresuid, which clears it
    os.chdir(config["work_dir"])
    os.execve(config["argv"][0], config["argv"], config["env"])


def _spawn_program(config: dict, uid: int | None) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            _exec_program(config, uid)
        except BaseException as error:  # noqa: BLE001 - any failure here is a sandbox setup failure
            _write_status(config["status_fd"], {"setup_error": f"{type(error).__name__}: {error}"})
        os._exit(SETUP_FAILED)
    return pid


def _supervise(config: dict, pid: int, uid: int | None) -> None:
    """Wait for the program and write its status line."""
    _, wait_status, usage = os.wait4(pid, 0)
    record: dict = {"cpu_s": usage.ru_utime + usage.ru_stime, "max_rss_bytes": usage.ru_maxrss * 1024}
    if os.WIFSIGNALED(wait_status):
        record["signal"] = os.WTERMSIG(wait_status)
    else:
        record["exit"] = os.WEXITSTATUS(wait_status)
    if uid is not None:
        record["uid"] = uid
    _write_status(config["status_fd"], record)


def _reaper(config: dict, uid: int) -> None:
    """pid 1 of the program's namespaces. Never returns."""
    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        _isolate(config, uid)
        pid = _spawn_program(config, uid)
    except BaseException as error:  # noqa: BLE001
        _write_status(config["status_fd"], {"setup_error": f"{type(error).__name__}: {error}"})
        os._exit(SETUP_FAILED)
    _supervise(config, pid, uid)
    os._exit(0)  # the kernel now kills everything left in the namespace


def main() -> None:
    config = json.loads(sys.argv[1])
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != config["parent_pid"]:
        os._exit(SETUP_FAILED)  # the evaluator died before we set the parent-death signal
    launcher_pid = os.getpid()
    if config["mode"] == "probe":
        _probe(config, launcher_pid)
    if config["mode"] == "os":
        linux.unshare(
            linux.CLONE_NEWNS | linux.CLONE_NEWNET | linux.CLONE_NEWPID | linux.CLONE_NEWIPC | linux.CLONE_NEWUTS
        )
        reaper = os.fork()
        if reaper == 0:
            _reaper(config, config["uid_base"] + launcher_pid)
        os.waitpid(reaper, 0)
    else:
        _supervise(config, _spawn_program(config, None), None)
    os._exit(0)


def _probe(config: dict, launcher_pid: int) -> None:
    """Check that `os` isolation works here: the same steps as a run, ending in a no-op."""
    try:
        linux.unshare(
            linux.CLONE_NEWNS | linux.CLONE_NEWNET | linux.CLONE_NEWPID | linux.CLONE_NEWIPC | linux.CLONE_NEWUTS
        )
        pid = os.fork()
        if pid == 0:
            try:
                linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
                _expose(config["needed"])
                _read_only_except(config["work_dir"])
                linux.mount("proc", "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
                uid = config["uid_base"] + launcher_pid
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                if not os.access(config["argv"][0], os.X_OK):  # reachable and runnable as that uid
                    raise PermissionError(f"{config['argv'][0]} is not executable by uid {uid}")
                os._exit(0)
            except BaseException as error:  # noqa: BLE001
                _write_status(config["status_fd"], {"setup_error": f"{type(error).__name__}: {error}"})
                os._exit(SETUP_FAILED)
        _, wait_status, _ = os.wait4(pid, 0)
        ok = os.WIFEXITED(wait_status) and os.WEXITSTATUS(wait_status) == 0
        _write_status(config["status_fd"], {"probe": ok})
    except OSError as error:
        _write_status(config["status_fd"], {"probe": False, "setup_error": f"{type(error).__name__}: {error}"})
    os._exit(0)


if __name__ == "__main__":
    main()
