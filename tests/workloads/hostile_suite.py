"""The hostile-program suite as a script, so it can run as any user (root, or an unprivileged uid).

    python hostile_suite.py SECRET_DIR ISOLATION [ISOLATION ...]

Prints one JSON object: for each isolation level, either {"unavailable": reason} or, per hostile
program, the failure kind and detail it got. `EXPECTED` is what containment means for each.
Programs marked `guard=False` run with the audit-hook guard off: the kernel side (namespaces,
bwrap, seccomp, rlimits) must contain them alone.
"""

from __future__ import annotations

import json
import os
import sys

LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
CONNECT = "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)\n"
RAISE_ERRNO = "if result != 0:\n    code = ctypes.get_errno()\n    raise OSError(code, os.strerror(code))\n"

# name -> (program, guard on?, expected failure kinds)
HOSTILE: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    "infinite_loop": ("while True:\n    pass\n", True, ("cpu_limit",)),
    "fork_storm": ("import os\nwhile True:\n    os.fork()\n", True, ("process_limit",)),
    "fork_storm_kernel": ("import os\nwhile True:\n    os.fork()\n", False, ("process_limit", "cpu_limit", "timeout")),
    "allocate_50_gb": ("block = bytearray(50 * 1024**3)\nprint('allocated')\n", True, ("memory_limit",)),
    "write_outside": ("open({outside!r}, 'w').write('pwned')\n", True, ("file_denied",)),
    "write_outside_kernel": ("open({outside!r}, 'w').write('pwned')\n", False, ("file_denied", "runtime_error")),
    "read_secret": ("print(open({secret!r}).read())\n", True, ("file_denied",)),
    "read_secret_kernel": ("print(open({secret!r}).read())\n", False, ("file_denied", "runtime_error")),
    "network_connect": (CONNECT, True, ("network_denied",)),
    "network_kernel": (CONNECT, False, ("syscall_denied",)),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", True, ("signal_denied",)),
    "kill_parent_kernel": (
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')\n",
        False,
        ("syscall_denied",),
    ),
    "ptrace_kernel": (
        LIBC + "result = libc.ptrace(16, os.getppid(), 0, 0)\n" + RAISE_ERRNO,
        False,
        ("syscall_denied",),
    ),
    "mount_kernel": (
        LIBC + "result = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)\n" + RAISE_ERRNO,
        False,
        ("syscall_denied",),
    ),
    "unshare_kernel": (LIBC + "result = libc.unshare(0x10000000)\n" + RAISE_ERRNO, False, ("syscall_denied",)),
}


# Under `process` isolation the guard is the only file and process barrier (it is no boundary, by
# design): with the guard off as root these would succeed, or fork without end. Not run there.
PROCESS_UNCONTAINED = ("fork_storm_kernel", "write_outside_kernel", "read_secret_kernel")


def run_suite(secret_dir: str, isolations: list[str]) -> dict:
    from trex.workloads.sandbox import Limits, Sandbox, SandboxConfigError

    secret = os.path.join(secret_dir, "secret.txt")
    outside = os.path.join(secret_dir, "pwned.txt")
    # the infinite loop must end on the 2 CPU s, not on a wall clock a loaded machine reaches first
    limits = Limits(wall_s=120, cpu_s=2, memory_bytes=2 << 30, file_size_bytes=8 << 20, max_processes=32)
    report: dict = {"uid": os.geteuid()}
    for isolation in isolations:
        results: dict = {}
        try:
            sandboxes = {
                guard: Sandbox(limits, isolation=isolation, hide=[secret_dir], guard=guard, workers=1)
                for guard in (True, False)
            }
        except SandboxConfigError as error:
            report[isolation] = {"unavailable": str(error)}
            continue
        try:
            for name, (program, guard, _) in HOSTILE.items():
                if isolation == "process" and name in PROCESS_UNCONTAINED:
                    continue
                execution = sandboxes[guard].run(program.format(secret=secret, outside=outside))
                results[name] = {
                    "failure": None if execution.failure is None else execution.failure.value,
                    "detail": execution.detail,
                    "isolation": execution.isolation,
                    "leaked": "TOP-SECRET" in execution.stdout + execution.stderr,
                }
            good = sandboxes[True].run("print(6 * 7)")
            results["still_works"] = good.ok and good.stdout.strip() == "42"
            results["outside_written"] = os.path.exists(outside)
        finally:
            for sandbox in sandboxes.values():
                sandbox.close()
        report[isolation] = results
    return report


if __name__ == "__main__":
    print(json.dumps(run_suite(sys.argv[1], sys.argv[2:])))
