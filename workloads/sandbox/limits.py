"""Resource limits of one sandboxed program."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from trex.errors import TrexError


class SandboxConfigError(TrexError):
    """The sandbox was configured with impossible limits or an unavailable isolation level."""


@dataclass(frozen=True)
class Limits:
    """What one program may use. Defaults fit benchmark-size OR models with room to spare.

    `cpu_s` is CPU time (RLIMIT_CPU: SIGXCPU, then SIGKILL a second later), `wall_s` is elapsed
    time (the evaluator kills the whole process tree), `memory_bytes` is address space
    (RLIMIT_AS: allocations beyond it fail with MemoryError), `file_size_bytes` caps every file
    the program writes, its stdout and stderr included (RLIMIT_FSIZE), and `max_processes`
    counts processes and threads (RLIMIT_NPROC, under `os` isolation where the program has a uid
    of its own; solvers start threads, so leave headroom). `work_dir_bytes` caps the work
    directory as a whole under `bwrap` (a size-limited tmpfs, shared by a worker's runs one at a
    time) and `namespaces` (a tmpfs of its own per run): writing past it fails with ENOSPC,
    reported as `output_limit`. Under `process` only each file is capped (`file_size_bytes`).
    """

    wall_s: float = 60.0
    cpu_s: float = 60.0
    memory_bytes: int = 4 << 30
    file_size_bytes: int = 32 << 20
    # solvers start a thread per core (COPT, Gurobi), and RLIMIT_NPROC counts threads
    max_processes: int = field(default_factory=lambda: max(64, 2 * (os.cpu_count() or 1) + 16))
    max_open_files: int = 256
    # all files of a work directory together (warm workers under bwrap: the size of their /tmp)
    work_dir_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value > 0:
                raise SandboxConfigError(f"sandbox limit {name} must be positive, got {value}")
        if self.memory_bytes < 256 << 20:
            raise SandboxConfigError(
                f"sandbox memory limit {self.memory_bytes} bytes is below 256 MiB, too little to start Python"
            )

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)
