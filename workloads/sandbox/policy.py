"""Which paths a sandboxed program may read, write or execute: one rule table, two enforcers.

The same `PathPolicy` is enforced twice: by the kernel in `os` isolation (the launcher masks the
denied paths in a private mount namespace and makes everything but the work directory read-only)
and by the in-process audit hook in every isolation level (which turns a denied access into a
clean `file_denied` report). Keeping one table means both enforcers agree on what is allowed.

Invariant: a decision is made by the *longest* rule whose path contains the queried path; with no
matching rule the answer is "deny". So `allow /repo/.venv` inside `deny /repo` keeps the
interpreter usable while hiding the rest of the checkout.

This module runs inside the sandbox too (copied next to the bootstrap), so it imports only the
standard library and never imports its package siblings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# Read-only system locations a Python program and its solvers legitimately touch through Python
# file APIs (C code reading shared libraries is not seen by the audit hook and needs no rule).
SYSTEM_READ_ROOTS: tuple[str, ...] = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/bin",
    "/sbin",
    "/etc",
    "/proc/self",
    "/proc/thread-self",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/sys/devices/system/cpu",
    "/sys/fs/cgroup",
    "/dev/null",
    "/dev/zero",
    "/dev/urandom",
    "/dev/random",
)

# Never readable, even though /etc is: credentials of the machine the evaluator runs on.
SYSTEM_READ_DENY: tuple[str, ...] = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh")

# The top-level directories a program sees under `os` isolation (read-only). Every other entry
# of / (/home, /root, /tmp, /var, /srv, /mnt, /opt, a /work or /data of the machine, ...) is
# masked, except the paths the interpreter needs and the program's own work directory.
VISIBLE_ROOTS: tuple[str, ...] = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
)

# Device files any program may open for writing.
WRITABLE_DEVICES: tuple[str, ...] = ("/dev/null",)


def normalize(path: str, cwd: str | None = None) -> str:
    """Absolute, symlink-free form of `path` (relative paths are taken against `cwd`)."""
    if not os.path.isabs(path):
        path = os.path.join(cwd if cwd is not None else os.getcwd(), path)
    return os.path.realpath(path)


def is_within(path: str, root: str) -> bool:
    """True when `path` is `root` or lies below it (both already normalized)."""
    if root == "/":
        return True
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class PathPolicy:
    """Longest-prefix rule table for reads, plus the directories writes and executables may use.

    `read_allow`/`read_deny`: path prefixes; the longest matching prefix decides.
    `write_roots`: the only places files may be created or modified (the work directory).
    `exec_roots`: where executables a program may start must live (solver binaries such as the
    CBC that PuLP ships); everything else, /bin/sh included, is refused.
    """

    read_allow: tuple[str, ...]
    read_deny: tuple[str, ...] = ()
    write_roots: tuple[str, ...] = ()
    exec_roots: tuple[str, ...] = ()
    _rules: tuple[tuple[str, bool], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rules: dict[str, bool] = {}
        for root in self.read_allow:
            rules[root] = True
        for root in self.read_deny:  # a path both allowed and denied is denied
            rules[root] = False
        ordered = sorted(rules.items(), key=lambda rule: len(rule[0]), reverse=True)
        object.__setattr__(self, "_rules", tuple(ordered))

    def may_read(self, path: str) -> bool:
        for root, allowed in self._rules:
            if is_within(path, root):
                return allowed
        return False

    def may_write(self, path: str) -> bool:
        if path in WRITABLE_DEVICES:
            return True
        if not self.may_read(path):
            return False
        return any(is_within(path, root) for root in self.write_roots)

    def may_execute(self, path: str) -> bool:
        return self.may_read(path) and any(is_within(path, root) for root in self.exec_roots)

    def to_json(self) -> dict[str, list[str]]:
        return {
            "read_allow": list(self.read_allow),
            "read_deny": list(self.read_deny),
            "write_roots": list(self.write_roots),
            "exec_roots": list(self.exec_roots),
        }

    @classmethod
    def from_json(cls, data: dict[str, list[str]]) -> PathPolicy:
        return cls(
            read_allow=tuple(data["read_allow"]),
            read_deny=tuple(data["read_deny"]),
            write_roots=tuple(data["write_roots"]),
            exec_roots=tuple(data["exec_roots"]),
        )
