"""The sandboxed interpreter: the paths it must be able to read (binary, prefixes, import path).

Both isolation choices need it: the probes that decide which level runs here (`isolation`) and the
bubblewrap containers that bind exactly these paths (`bwrap`).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

from trex.workloads.sandbox.limits import SandboxConfigError


@dataclass(frozen=True)
class InterpreterPaths:
    """Paths the sandboxed interpreter reads: its binary, prefixes and import path."""

    executable: str  # as given (a virtualenv's bin/python must keep its path to find pyvenv.cfg)
    needed: tuple[str, ...]  # normalized, minimal: none lies inside another
    site_packages: tuple[str, ...]

    @classmethod
    def of(cls, python: str) -> InterpreterPaths:
        script = (
            "import json, sys, sysconfig; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
            "sys.base_exec_prefix, sys.path, sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']]))"
        )
        try:
            out = subprocess.run([python, "-I", "-c", script], capture_output=True, text=True, timeout=60, check=True)
        except (OSError, subprocess.SubprocessError) as error:
            raise SandboxConfigError(f"cannot start the sandbox interpreter {python}: {error}") from error
        *prefixes, path, purelib, platlib = json.loads(out.stdout)
        candidates = [python, os.path.dirname(python), os.path.realpath(python), *prefixes, *path]
        site = tuple(dict.fromkeys(os.path.realpath(p) for p in (purelib, platlib) if os.path.isdir(p)))
        return cls(executable=python, needed=minimal_roots(candidates), site_packages=site)


def minimal_roots(paths: list[str]) -> tuple[str, ...]:
    """Existing paths, normalized, without the ones that lie inside another."""
    normalized = sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)}, key=len)
    roots: list[str] = []
    for path in normalized:
        if not any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots):
            roots.append(path)
    return tuple(sorted(roots))
