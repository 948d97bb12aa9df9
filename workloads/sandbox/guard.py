"""In-process guard: a PEP 578 audit hook that refuses what a sandboxed program may not do.

Installed by the bootstrap just before the program's first line runs. It turns the policy into
clean, attributable failures: the attempt raises `SandboxViolation` (a `PermissionError`) in the
program and is reported on the events channel even if the program catches the exception, so a
program that tries something forbidden fails with that kind whatever it prints afterwards.

What it refuses:
- opening, listing, creating, renaming, linking or changing files outside the `PathPolicy`
  (reads: the interpreter, site-packages, system directories, the work directory; writes: the
  work directory only) -> `file_denied`
- any socket but AF_UNIX inside the work directory, and DNS look-ups -> `network_denied`
- `os.fork`, `os.system`, and starting any executable outside the policy's executable roots
  (solver binaries such as PuLP's CBC are allowed) -> `process_limit`
- signalling anything but the program itself and the processes it started -> `signal_denied`
- through ctypes: loading the whole process (`CDLL(None)`) or a library outside the readable
  paths, resolving the C functions that open files, start processes, open sockets or send
  signals (`open`, `fork`, `execve`, `socket`, `kill`, `syscall`, ...), or anything but the
  Python C API through `ctypes.pythonapi` -> `forbidden`

Limits, stated plainly: an audit hook is not a security boundary (PEP 578 says so). Code that
sets out to defeat it can, e.g. by corrupting interpreter memory or by calling
`_posixsubprocess.fork_exec` directly. Against such code the boundary is the `os` isolation
level (namespaces, read-only mounts, a separate uid), which does not rely on this hook.

Runs inside the sandbox (copied next to the bootstrap): standard library only.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import Any

Emit = Callable[[dict], None]


class SandboxViolation(PermissionError):
    """Raised in the sandboxed program when it attempts something the sandbox forbids."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"sandbox: {detail}")
        self.kind = kind
        self.detail = detail


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_DNS_EVENTS = (
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyaddr",
    "socket.getnameinfo",
    "socket.gethostbyname_ex",
)
_PATH_WRITE_EVENTS = {  # event -> index of the path argument that is created or modified
    "os.mkdir": 0,
    "os.rmdir": 0,
    "os.remove": 0,
    "os.truncate": 0,
    "os.chmod": 0,
    "os.chown": 0,
    "os.utime": 0,
    "os.setxattr": 0,
    "os.removexattr": 0,
    "os.mknod": 0,
    "os.mkfifo": 0,
    "os.symlink": 1,
    "sqlite3.connect": 0,
}


# C functions a program must not reach through ctypes: they would do what the rules above forbid
# without an audit event. (dlsym on any library also searches its dependencies, libc included,
# so the names are checked whatever library they are looked up in.)
FORBIDDEN_C_SYMBOLS = frozenset(
    [
        "open",
        "open64",
        "openat",
        "openat64",
        "openat2",
        "creat",
        "creat64",
        "fopen",
        "fopen64",
        "freopen",
        "popen",
        "pclose",
        "rename",
        "renameat",
        "renameat2",
        "unlink",
        "unlinkat",
        "link",
        "linkat",
        "symlink",
        "symlinkat",
        "truncate",
        "ftruncate",
        "mkdir",
        "mkdirat",
        "rmdir",
        "chmod",
        "fchmod",
        "fchmodat",
        "chown",
        "fchown",
        "lchown",
        "fchownat",
        "fork",
        "vfork",
        "clone",
        "clone3",
        "execve",
        "execv",
        "execvp",
        "execvpe",
        "execl",
        "execlp",
        "execle",
        "fexecve",
        "system",
        "posix_spawn",
        "posix_spawnp",
        "daemon",
        "kill",
        "killpg",
        "tgkill",
        "tkill",
        "raise",
        "sigqueue",
        "pthread_kill",
        "socket",
        "socketpair",
        "connect",
        "bind",
        "listen",
        "accept",
        "accept4",
        "sendto",
        "sendmsg",
        "getaddrinfo",
        "gethostbyname",
        "syscall",
        "ptrace",
        "mount",
        "umount",
        "umount2",
        "unshare",
        "setns",
        "chroot",
        "pivot_root",
        "prctl",
        "seccomp",
        "dlopen",
        "dlmopen",
        "dlsym",
        "dlvsym",
        "mprotect",
        "setuid",
        "setgid",
        "setresuid",
        "setresgid",
        "setsid",
        "setpgid",
    ]
)


_HANDLED_EVENTS = frozenset(
    {
        "open",
        "os.listdir",
        "os.scandir",
        "os.chdir",
        "os.rename",
        "os.link",
        "os.fork",
        "os.forkpty",
        "os.system",
        "subprocess.Popen",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "urllib.Request",
        "os.kill",
        "os.killpg",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.dlsym/handle",
        *_PATH_WRITE_EVENTS,
        *_DNS_EVENTS,
    }
)


def make_hook(policy: Any, emit: Emit, *, allow_fork: bool = False) -> Callable[[str, tuple], None]:
    """The audit hook enforcing `policy` (a `PathPolicy`); `emit` reports each violation.

    Everything the hook uses is bound here, not looked up in module globals at call time, so a
    program that rebinds names in this module does not change the hook's behaviour.
    """
    import ctypes

    pythonapi = ctypes.pythonapi
    fsdecode, realpath, getcwd = os.fsdecode, os.path.realpath, os.getcwd
    isabs, join, which = os.path.isabs, os.path.join, _which
    getpid, getpgrp, getpgid, getppid = os.getpid, os.getpgrp, os.getpgid, os.getppid
    af_unix = socket.AF_UNIX
    forbidden_symbols = FORBIDDEN_C_SYMBOLS
    may_read, may_write, may_execute = policy.may_read, policy.may_write, policy.may_execute
    _str, _bytes, _int, _isinstance = str, bytes, int, isinstance

    def deny(kind: str, detail: str) -> None:
        emit({"event": "violation", "kind": kind, "detail": detail})
        raise SandboxViolation(kind, detail)

    def resolve(path: Any) -> str | None:
        if path is None or _isinstance(path, _int):
            return None  # an already-open descriptor: its opening was checked
        path = fsdecode(path)
        return realpath(path if isabs(path) else join(getcwd(), path))

    def check_read(path: Any, what: str) -> None:
        real = resolve(path)
        if real is not None and not may_read(real):
            deny("file_denied", f"{what} {fsdecode(path)!r}: outside the sandbox's readable paths")

    def check_write(path: Any, what: str) -> None:
        real = resolve(path)
        if real is not None and not may_write(real):
            deny("file_denied", f"{what} {fsdecode(path)!r}: writes are allowed only in the work directory")

    def check_exec(executable: Any, argv: Any, env: Any) -> None:
        name = executable
        if name is None:
            name = argv if _isinstance(argv, (_str, _bytes)) else (argv[0] if argv else None)
        if name is None:
            deny("process_limit", "start a process without an executable")
        name = fsdecode(name)
        path = name if "/" in name else which(name, env)
        if path is None or not may_execute(realpath(path)):
            deny("process_limit", f"start {name!r}: only solver executables may be started")

    def check_kill(pid: int, what: str) -> None:
        # Only the program itself and processes it started (they share its process group) may
        # be signalled; never its parent (the sandbox's launcher or reaper) or a whole group,
        # which would include that parent.
        me, group, parent = getpid(), getpgrp(), getppid()
        if pid == me:
            return
        if pid > 1 and pid != parent:
            try:
                if getpgid(pid) == group:
                    return
            except OSError:
                pass
        deny("signal_denied", f"{what}({pid}): only the program and processes it started may be signalled")

    handled = _HANDLED_EVENTS

    def hook(event: str, args: tuple) -> None:
        if event not in handled:  # most events (import, compile, exec, ...) need no decision
            return
        if event == "open":
            path, mode, flags = args
            writes = (_isinstance(mode, _str) and any(c in mode for c in "wax+")) or (
                _isinstance(flags, _int) and flags & _WRITE_FLAGS
            )
            (check_write if writes else check_read)(path, "open")
        elif event in ("os.listdir", "os.scandir", "os.chdir"):
            check_read(args[0] if args and args[0] is not None else ".", event[3:])
        elif event in _PATH_WRITE_EVENTS:
            path = args[_PATH_WRITE_EVENTS[event]]
            if not (event == "sqlite3.connect" and path in (":memory:", "", b":memory:")):
                check_write(path, event)
        elif event == "os.rename":
            check_write(args[0], "rename")
            check_write(args[1], "rename to")
        elif event == "os.link":
            check_read(args[0], "link")
            check_write(args[0], "link")  # a hard link must not smuggle a file into the work dir
            check_write(args[1], "link to")
        elif event in ("os.fork", "os.forkpty"):
            if not allow_fork:
                deny("process_limit", f"{event[3:]}(): programs may not fork")
        elif event == "os.system":
            deny("process_limit", "os.system(): programs may not run shell commands")
        elif event == "subprocess.Popen":
            executable, argv, _cwd, env = args
            check_exec(executable, argv, env)
        elif event in ("os.exec", "os.posix_spawn"):
            check_exec(args[0], args[1], args[2])
        elif event == "os.spawn":
            check_exec(args[1], args[2], args[3])
        elif event == "socket.__new__":
            family = args[1]
            if family != af_unix:
                deny("network_denied", f"socket(family={family}): the sandbox has no network")
        elif event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            address = args[1]
            if _isinstance(address, (_str, _bytes)) and address and address[:1] not in ("\0", b"\0"):
                check_write(address, event)
            elif _isinstance(address, (_str, _bytes)):
                deny("network_denied", f"{event} to an abstract unix socket")
        elif event in _DNS_EVENTS:
            deny("network_denied", f"{event}({args[0]!r}): the sandbox has no network")
        elif event == "urllib.Request":
            deny("network_denied", f"urllib request to {args[0]!r}: the sandbox has no network")
        elif event == "os.kill":
            check_kill(args[0], "kill")
        elif event == "os.killpg":
            check_kill(-args[0] if args[0] > 0 else -1, "killpg")
        elif event == "ctypes.dlopen":
            name = args[0]
            if name is None:
                deny("forbidden", "ctypes.CDLL(None): the process's own symbols are off limits")
            path = fsdecode(name)
            if isabs(path) and not may_read(realpath(path)):
                deny("forbidden", f"ctypes load of {path!r}: outside the sandbox's readable paths")
        elif event == "ctypes.dlsym":
            library, name = args
            if _isinstance(name, _str) and name in forbidden_symbols:
                deny("forbidden", f"ctypes symbol {name!r}: a program may not call it directly")
            if library is pythonapi and not (_isinstance(name, _str) and name.startswith(("Py", "_Py"))):
                deny("forbidden", f"ctypes.pythonapi.{name}: only Python C-API symbols")
        elif event == "ctypes.dlsym/handle":
            deny("forbidden", f"ctypes symbol {args[1]!r} by raw handle")

    return hook


def _which(name: str, env: Any) -> str | None:
    """`shutil.which` without importing shutil inside an audit hook."""
    path = None
    if isinstance(env, dict):
        path = env.get("PATH", env.get(b"PATH"))
    if path is None:
        path = os.environ.get("PATH", os.defpath)
    for directory in os.fsdecode(path).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def install(policy: Any, emit: Emit, *, allow_fork: bool = False) -> None:
    """Install the guard for the rest of this interpreter's life (audit hooks cannot be removed)."""
    sys.addaudithook(make_hook(policy, emit, allow_fork=allow_fork))
