"""cgroup-v2 limits for the warm workers: memory, processes and CPU per worker, where delegated.

rlimits bound one process (address space, CPU seconds, its uid's task count); a cgroup bounds a
worker and everything its programs start together, in the units the kernel accounts: resident
memory including the tmpfs work directory's pages (`memory.max`, swap off), tasks (`pids.max`),
and CPU bandwidth (`cpu.max`, one core per worker; a cold run under `namespaces` gets a leaf of
its own, removed after it). It also counts the CPU time of the whole tree
(`cpu.stat`, present in every cgroup v2 directory, controllers or not), which the evaluator's
RUSAGE_CHILDREN never sees for a bubblewrap container, and kills the whole tree at once
(`cgroup.kill`).

    support = probe()                             # where runs go, what can be enforced, why not the rest
    run = RunCgroup.create(support, limits)       # <own cgroup>/trex-sandbox-<pid>-<start>-<n>/
    argv = run.join_command("worker-0", argv)     # the command moves itself into that leaf, then execs
    run.oom_kills("worker-0")                     # memory.events oom_kill: programs killed by memory.max
    run.close()                                   # kill what is left, remove the directories

Layout: the run directory enables the controllers for its children (`cgroup.subtree_control`; it
holds no process itself, as cgroup v2 requires), each worker has a leaf `worker-<slot>` carrying
the limits (a cold run's leaf is `run-<n>`). The run directory is named after the evaluator's pid and kernel start time (as the
sandbox directories are, `cleanup`), so the next `Sandbox` removes what a SIGKILLed evaluator left
(`remove_abandoned_cgroups`).

Where the controllers cannot be enabled (no cgroup v2 mounted; a hybrid layout whose memory, pids
and cpu controllers are bound to cgroup v1 hierarchies; a cgroup the evaluator may not write; a
parent cgroup that holds processes, which cgroup v2 forbids to have controlled children) the run
still gets its cgroup when one can be created at all (CPU accounting, kill on close), the limits
that cannot be enforced are listed in `CgroupSupport.missing`, and `CgroupSupport.reason` says
why: the sandbox reports it per run, as it reports its isolation level. rlimits apply either way.
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import time
from dataclasses import dataclass, field

from trex.workloads.sandbox.cleanup import BASE_PREFIX, process_start_time

CONTROLLERS = ("memory", "pids", "cpu")
# On top of a program's own allowance: the worker's interpreter and preloaded solvers, bwrap.
WORKER_MEMORY_MARGIN = 768 << 20
WORKER_TASK_MARGIN = 32
CPU_PERIOD_US = 100_000
JOIN_SHELL = "/bin/sh"  # moves itself into a leaf, then execs the command (`RunCgroup.join_command`)


@dataclass(frozen=True)
class CgroupSupport:
    """What this process may do with cgroup v2. `parent` is None when no run cgroup can be made."""

    parent: str | None  # the cgroup directory run cgroups are created in (this process's own)
    controllers: tuple[str, ...]  # of CONTROLLERS, those a run cgroup can enforce
    reason: str | None  # why some or all of CONTROLLERS cannot be enforced; None when all can

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(name for name in CONTROLLERS if name not in self.controllers)

    def summary(self) -> str:
        """One line for reports: what is enforced, and why the rest is not."""
        if self.parent is None:
            return f"none ({self.reason})"
        enforced = "+".join(self.controllers) if self.controllers else "accounting only"
        return enforced if self.reason is None else f"{enforced} ({self.reason})"


def _mount_point() -> tuple[str, str] | None:
    """(mount point, root inside the hierarchy) of the cgroup2 file system, or None."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
            for line in mountinfo:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"]:
                    fields = left.split()
                    return fields[4], fields[3]
    except OSError:
        return None
    return None


def _own_cgroup() -> tuple[str | None, list[str]]:
    """This process's cgroup v2 path, and the controllers bound to cgroup v1 hierarchies."""
    v2, v1_controllers = None, []
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as cgroups:
            for line in cgroups:
                number, controllers, path = line.rstrip("\n").split(":", 2)
                if number == "0" and controllers == "":
                    v2 = path
                else:
                    v1_controllers += [name for name in controllers.split(",") if name in CONTROLLERS]
    except (OSError, ValueError):
        pass
    return v2, v1_controllers


def _read(path: str) -> str:
    with open(path, encoding="ascii") as file:
        return file.read()


def probe() -> CgroupSupport:
    """Where this process can make run cgroups and which limits they can enforce (see the module
    docstring). Writes only to enable controllers for this cgroup's children when they are
    available but not yet enabled (which is what delegating them means)."""
    mount = _mount_point()
    own, v1_controllers = _own_cgroup()
    if mount is None or own is None:
        return CgroupSupport(None, (), "no cgroup v2 file system is mounted")
    mount_point, mount_root = mount
    relative = os.path.relpath(own, mount_root) if own.startswith(mount_root) else None
    if relative is None or relative.startswith(".."):
        return CgroupSupport(None, (), f"this process's cgroup {own} lies outside the mounted {mount_point}")
    parent = os.path.normpath(os.path.join(mount_point, relative))
    if not os.access(parent, os.W_OK):
        return CgroupSupport(
            None, (), f"the cgroup {parent} is not writable by uid {os.geteuid()} (no delegated cgroup v2 subtree)"
        )
    try:
        available = _read(os.path.join(parent, "cgroup.controllers")).split()
        enabled = _read(os.path.join(parent, "cgroup.subtree_control")).split()
    except OSError as error:
        return CgroupSupport(None, (), f"cannot read the controllers of {parent}: {error.strerror}")
    usable = [name for name in CONTROLLERS if name in available]
    to_enable = [name for name in usable if name not in enabled]
    problems = []
    if to_enable:
        try:
            with open(os.path.join(parent, "cgroup.subtree_control"), "w", encoding="ascii") as control:
                control.write(" ".join(f"+{name}" for name in to_enable))
        except OSError as error:
            usable = [name for name in usable if name not in to_enable]
            why = (
                "it holds processes, and cgroup v2 gives controllers only to the children of a cgroup "
                "without any (start the evaluator in a delegated cgroup of its own, e.g. "
                "`systemd-run --user --scope -p Delegate=yes trex ...`)"
                if error.errno == errno.EBUSY
                else error.strerror
            )
            problems.append(f"cannot enable {', '.join(to_enable)} in {parent}: {why}")
    absent = [name for name in CONTROLLERS if name not in available]
    if absent:
        bound = [name for name in absent if name in v1_controllers]
        where = f"; {', '.join(bound)} bound to cgroup v1 hierarchies (a hybrid layout)" if bound else ""
        problems.insert(
            0, f"the cgroup v2 hierarchy at {parent} offers {' '.join(available) or 'no controllers'}{where}"
        )
    return CgroupSupport(parent, tuple(usable), "; ".join(problems) or None)


def _leaf_limits(limits: dict) -> dict[str, str]:
    """The files a worker's leaf gets, from a program's `Limits` (one program per worker at a time)."""
    memory = limits["memory_bytes"] + limits["work_dir_bytes"] + WORKER_MEMORY_MARGIN
    return {
        "memory.max": str(memory),
        "memory.swap.max": "0",
        "pids.max": str(limits["max_processes"] + WORKER_TASK_MARGIN),
        "cpu.max": f"{CPU_PERIOD_US} {CPU_PERIOD_US}",  # one core's worth per period
    }


_run_numbers = itertools.count()


def _run_name(pid: int, started: str) -> str:
    """`trex-sandbox-<pid>-<start time>-<n>`: the n-th run cgroup of that process."""
    return f"{BASE_PREFIX}{pid}-{started}-{next(_run_numbers)}"


@dataclass
class RunCgroup:
    """One evaluator's cgroup: `<parent>/trex-sandbox-<pid>-<start>-<n>/worker-<slot>`."""

    path: str
    controllers: tuple[str, ...]
    limits: dict
    leaves: dict[str, str] = field(default_factory=dict)
    _written: dict[str, dict] = field(default_factory=dict)  # leaf name -> the limits its files hold

    @classmethod
    def create(cls, support: CgroupSupport, limits: dict) -> RunCgroup:
        """Make the run cgroup; raises OSError when it cannot be made (the caller reports why)."""
        if support.parent is None:
            raise OSError(errno.ENOENT, support.reason or "no cgroup v2")
        remove_abandoned_cgroups(support.parent)
        path = os.path.join(support.parent, _run_name(os.getpid(), process_start_time(os.getpid()) or "0"))
        os.mkdir(path)
        run = cls(path, support.controllers, dict(limits))
        if support.controllers:
            try:
                run._write(path, "cgroup.subtree_control", " ".join(f"+{name}" for name in support.controllers))
            except OSError:
                run.close()
                raise
        return run

    def _write(self, directory: str, name: str, value: str) -> None:
        with open(os.path.join(directory, name), "w", encoding="ascii") as file:
            file.write(value)

    def leaf(self, name: str) -> str:
        """The leaf `name` (a worker's `worker-<slot>`, a cold run's `run-<id>`), made with its
        limits on first use."""
        leaf = self.leaves.get(name)
        if leaf is None:
            leaf = os.path.join(self.path, name)
            if not os.path.isdir(leaf):
                os.mkdir(leaf)
            self.leaves[name] = leaf
            self.set_limits(name, self.limits)
        return leaf

    def set_limits(self, name: str, limits: dict) -> None:
        """Write leaf `name`'s limit files for a program of `limits` (a run may bring its own)."""
        leaf = self.leaf(name)
        if self._written.get(name) == limits:
            return
        for file, value in _leaf_limits(limits).items():
            if file.split(".")[0] in self.controllers and os.path.exists(os.path.join(leaf, file)):
                self._write(leaf, file, value)
        self._written[name] = dict(limits)

    def join_command(self, name: str, argv: list[str]) -> list[str]:
        """`argv` behind a shell that first moves itself into leaf `name`: everything the command
        starts is born inside it (no fork can slip out between spawn and move)."""
        procs = os.path.join(self.leaf(name), "cgroup.procs")
        return [JOIN_SHELL, "-c", 'echo $$ > "$0" && exec "$@"', procs, *argv]

    def remove_leaf(self, name: str) -> None:
        """Kill what is left in leaf `name` and remove it (a cold run's, once it has ended)."""
        leaf = self.leaves.pop(name, None)
        self._written.pop(name, None)
        if leaf is not None:
            _kill_and_remove(leaf)

    def limit_text(self, name: str) -> str:
        leaf = self.leaf(name)
        values = []
        for name in ("memory.max", "pids.max", "cpu.max"):
            try:
                values.append(f"{name}={_read(os.path.join(leaf, name)).strip()}")
            except OSError:
                continue
        return ", ".join(values)

    def oom_kills(self, name: str) -> int:
        """How many processes memory.max has killed in leaf `name` so far."""
        return _event_count(os.path.join(self.leaf(name), "memory.events"), "oom_kill")

    def cpu_s(self) -> float:
        """CPU seconds used so far by every process that ran in this run's cgroup."""
        try:
            for line in _read(os.path.join(self.path, "cpu.stat")).splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return 0.0

    def close(self) -> None:
        """Kill whatever still runs in the run cgroup, then remove its directories."""
        _kill_and_remove(self.path)
        self.leaves.clear()
        self._written.clear()


def _event_count(path: str, key: str) -> int:
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _pids_of(directory: str) -> list[int]:
    pids = []
    for current, _, _ in os.walk(directory):
        try:
            pids += [int(pid) for pid in _read(os.path.join(current, "cgroup.procs")).split()]
        except (OSError, ValueError):
            continue
    return pids


def _kill_and_remove(path: str) -> None:
    """SIGKILL every process of the cgroup tree at `path` (cgroup.kill where the kernel has it,
    else one by one until none is left), then remove its directories, leaves first."""
    if not os.path.isdir(path):
        return
    try:
        with open(os.path.join(path, "cgroup.kill"), "w", encoding="ascii") as kill:
            kill.write("1")
    except OSError:
        pass
    deadline = time.monotonic() + 5.0
    while True:
        pids = _pids_of(path)
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
    for current, _, _ in sorted(os.walk(path), key=lambda entry: -entry[0].count(os.sep)):
        for _attempt in range(100):  # a killed process leaves its cgroup a moment after it dies
            try:
                os.rmdir(current)
                break
            except FileNotFoundError:
                break
            except OSError as error:
                if error.errno != errno.EBUSY:
                    break
                time.sleep(0.01)


def _owner_alive(name: str) -> bool | None:
    """Whether the evaluator a run cgroup is named after still runs; None for other names."""
    if not name.startswith(BASE_PREFIX):
        return None
    parts = name[len(BASE_PREFIX) :].split("-")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        return None
    return process_start_time(int(parts[0])) == parts[1]


def remove_abandoned_cgroups(parent: str) -> list[str]:
    """Remove the run cgroups under `parent` whose evaluator is gone (killed before its `close`)."""
    removed = []
    try:
        entries = os.listdir(parent)
    except OSError:
        return removed
    for entry in entries:
        path = os.path.join(parent, entry)
        if _owner_alive(entry) is False and os.path.isdir(path):
            _kill_and_remove(path)
            removed.append(path)
    return removed
