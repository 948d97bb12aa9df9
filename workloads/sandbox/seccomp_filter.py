"""The sandbox's seccomp filter: system calls a model-written program has no business making.

Built with libseccomp (through `pyseccomp`) and loaded into each program's process just before its
first line runs, after `PR_SET_NO_NEW_PRIVS`; it is inherited by everything the program starts and
cannot be removed. Every other system call is allowed: the filter is a deny list of what breaks
containment, not an allow list of what Python needs (that one would break with every solver
release). Denied, each with its own errno so a report can name it:

- network: `socket` for any family but AF_UNIX, `connect`
- debugging and reading other processes: `ptrace`, `process_vm_readv/writev`
- the file-system view: `mount`, `umount2`, `pivot_root`, `chroot`, the new mount API
- namespaces: `unshare`, `setns`, `clone` with a CLONE_NEW* flag, `clone3` (its flags sit behind a
  pointer a filter cannot read; it fails with ENOSYS, so libc falls back to `clone`)
- the kernel: `kexec_load`, `kexec_file_load`, `bpf`, `perf_event_open`, `userfaultfd`, module
  loading, `reboot`, `swapon/off`, `syslog`, clock setting, `acct`, `quotactl`, file handles
- keyrings: `keyctl`, `add_key`, `request_key`
- process-tree escapes: `setsid`, `setpgid` (leaving the group the sandbox kills), signals to the
  protected pids (the worker or launcher above the program, pid 1 of its namespace, and -1 = all)

A denied call fails with errno `ERRNO_BASE + i` (i: the call's place in `DENIED`); the sandbox
reports an exception carrying such an errno as `syscall_denied` with the call's name.

libseccomp turns its rules into a BPF program on every `load()` (1.5-4 ms a program, measured in
bench/RESULTS.md section 6). A warm worker compiles the filter once (`Compiled`: libseccomp's own
export of the BPF program it would load) and each child installs those same instructions with one
`prctl(PR_SET_SECCOMP)`, the call `seccomp_load` makes with this filter's attributes (no thread
sync, no logging flags).

Runs inside the sandbox (copied next to the bootstrap): standard library and pyseccomp only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as errno_codes
import os

AF_UNIX = 1
ERRNO_BASE = 3900  # SECCOMP_RET_ERRNO carries up to 4095; glibc reports these as "Unknown error N"

DENIED: tuple[str, ...] = (
    "socket",
    "connect",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsmount",
    "fsconfig",
    "move_mount",
    "open_tree",
    "fspick",
    "unshare",
    "setns",
    "clone",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "acct",
    "quotactl",
    "open_by_handle_at",
    "name_to_handle_at",
    "keyctl",
    "add_key",
    "request_key",
    "setsid",
    "setpgid",
    "kill",
    "tkill",
    "tgkill",
    "pidfd_open",
    "pidfd_send_signal",
)
_CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_SIGNAL_CALLS = ("kill", "tkill", "pidfd_open")  # first argument: the target pid
_MASK32 = 0xFFFFFFFF


def errno_for(name: str) -> int:
    return ERRNO_BASE + DENIED.index(name)


def denied_call(code: object) -> str | None:
    """The system call a seccomp denial with errno `code` refused, or None."""
    if isinstance(code, int) and ERRNO_BASE <= code < ERRNO_BASE + len(DENIED):
        return DENIED[code - ERRNO_BASE]
    return None


def available() -> str | None:
    """None when a filter can be built here, else why not."""
    try:
        import pyseccomp  # noqa: F401
    except Exception as error:  # noqa: BLE001 - ImportError, or OSError when libseccomp.so.2 is missing
        return f"pyseccomp unavailable ({type(error).__name__}: {error})"
    return None


def build(protected_pids: tuple[int, ...]):
    """The filter (not loaded yet): load it with `.load()` in the process to confine.
    `protected_pids` may not be signalled (the sandbox's own processes above the program)."""
    import pyseccomp as seccomp

    denied = seccomp.SyscallFilter(defaction=seccomp.ALLOW)

    def deny(name: str, *arguments) -> None:
        try:
            denied.add_rule(seccomp.ERRNO(errno_for(name)), name, *arguments)
        except (OSError, RuntimeError, ValueError):  # a call this kernel/architecture does not have
            pass

    for name in DENIED:
        if name == "socket":
            deny(name, seccomp.Arg(0, seccomp.NE, AF_UNIX))
        elif name == "clone":
            for flag in _CLONE_NAMESPACE_FLAGS:
                deny(name, seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        elif name in _SIGNAL_CALLS:
            for pid in {1, *protected_pids}:
                deny(name, seccomp.Arg(0, seccomp.MASKED_EQ, _MASK32, pid & _MASK32))
                if name == "kill":  # the protected process's group, and every process (-1)
                    deny(name, seccomp.Arg(0, seccomp.MASKED_EQ, _MASK32, -pid & _MASK32))
            if name == "kill":
                deny(name, seccomp.Arg(0, seccomp.MASKED_EQ, _MASK32, -1 & _MASK32))
        elif name == "tgkill":
            for pid in {1, *protected_pids}:
                deny(name, seccomp.Arg(0, seccomp.MASKED_EQ, _MASK32, pid & _MASK32))
        elif name == "pidfd_send_signal":
            continue  # needs a pidfd, and pidfd_open of a protected pid is denied
        else:
            deny(name)
    try:
        denied.add_rule(seccomp.ERRNO(errno_codes.ENOSYS), "clone3")
    except (OSError, RuntimeError, ValueError):
        pass
    return denied


PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_SET_NO_NEW_PRIVS = 38
_BPF_INSTRUCTION_BYTES = 8  # struct sock_filter: u16 code, u8 jt, u8 jf, u32 k


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Compiled:
    """A filter's BPF program, exported once by libseccomp (`bpf`: the raw instructions), ready to
    install in any number of forked children: all the work is done here, so `install` is two
    `prctl` calls and allocates nothing."""

    def __init__(self, built) -> None:
        self.bpf = export_bpf(built)
        if not self.bpf or len(self.bpf) % _BPF_INSTRUCTION_BYTES:
            raise ValueError(f"libseccomp exported {len(self.bpf)} bytes, not a whole number of BPF instructions")
        self._instructions = ctypes.create_string_buffer(self.bpf, len(self.bpf))
        self._program = _SockFprog(len(self.bpf) // _BPF_INSTRUCTION_BYTES, ctypes.addressof(self._instructions))
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        self._address = ctypes.addressof(self._program)

    def install(self) -> None:
        """Confine the calling process (and everything it starts) for good, like `load()`."""
        if self._libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            self._fail("PR_SET_NO_NEW_PRIVS")
        if self._libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._address, 0, 0) != 0:
            self._fail("PR_SET_SECCOMP")

    @staticmethod
    def _fail(what: str) -> None:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl({what}) installing the seccomp filter: {os.strerror(code)}")


def export_bpf(built) -> bytes:
    """The BPF program libseccomp generates for `built` (what its `load()` would install)."""
    fd = os.memfd_create("trex-seccomp-bpf")
    with os.fdopen(fd, "w+b") as file:
        built.export_bpf(file)
        file.seek(0)
        return file.read()
