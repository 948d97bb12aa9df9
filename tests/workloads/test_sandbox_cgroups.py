"""cgroup-v2 limits for the sandbox's workers (issue 21): detection, the reason reported when the
machine offers none, the run cgroup's life (workers inside it, accounting, removal on close and
after a SIGKILL of the evaluator), and the limits themselves where the controllers are delegated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from workload_helpers import FAST_LIMITS, ISOLATIONS

from trex.workloads.sandbox import FailureKind, Limits, Sandbox
from trex.workloads.sandbox.cgroups import (
    CONTROLLERS,
    WORKER_MEMORY_MARGIN,
    WORKER_TASK_MARGIN,
    RunCgroup,
    probe,
    remove_abandoned_cgroups,
)
from trex.workloads.sandbox.execution import RawOutcome, classify

SUPPORT = probe()
requires_cgroup = pytest.mark.skipif(SUPPORT.parent is None, reason=f"no writable cgroup v2 here: {SUPPORT.reason}")
requires_controllers = pytest.mark.skipif(
    bool(SUPPORT.missing),
    reason=f"cgroup v2 limits cannot be enforced here: {SUPPORT.reason}",
)


def test_the_probe_says_what_is_enforced_and_why_the_rest_is_not():
    assert set(SUPPORT.controllers) <= set(CONTROLLERS)
    assert (SUPPORT.reason is None) == (SUPPORT.parent is not None and not SUPPORT.missing)
    summary = SUPPORT.summary()
    if SUPPORT.reason is not None:
        assert SUPPORT.reason in summary
    if SUPPORT.parent is None:
        assert summary.startswith("none (")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_cgroup_limits_in_use_are_reported_per_run(sandboxes, isolation):
    sandbox = sandboxes(isolation)
    assert sandbox.cgroup == sandbox.cgroup_support.summary()
    assert sandbox.run("print(1)").ok
    if sandbox.cgroup_support.parent is None:
        assert sandbox.cgroup.startswith("none (")


def test_cgroup_limits_can_be_turned_off():
    with Sandbox(FAST_LIMITS, isolation="process", workers=1, cgroup=False) as sandbox:
        assert sandbox.cgroup == "none (cgroup limits are off)"
        assert sandbox._cgroup is None and sandbox.run("print(1)").ok


@requires_cgroup
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_workers_and_programs_run_inside_the_run_cgroup_which_close_removes(isolation):
    with Sandbox(FAST_LIMITS, isolation=isolation, workers=1, guard=False) as sandbox:  # the guard hides /proc
        run_cgroup = sandbox._cgroup.path
        assert os.path.basename(run_cgroup).startswith("trex-sandbox-")
        program = "import time\nprint(open('/proc/self/cgroup').read().strip().split(':')[-1])\nsum(range(3_000_000))\n"
        execution = sandbox.run(program)
        assert execution.ok, execution.detail
        if isolation != "bwrap":  # bwrap's own cgroup namespace shows the program "/" instead
            assert execution.stdout.strip().startswith(run_cgroup[len(SUPPORT.parent) :])
        if sandbox.warm:
            procs = open(os.path.join(run_cgroup, "worker-0", "cgroup.procs")).read().split()
            assert procs, "the warm worker is not in its leaf"
            assert sandbox.worker_cpu_s > 0.05  # the cgroup counted the worker's start-up and the program
    assert not os.path.exists(run_cgroup)


@requires_cgroup
def test_sigkill_of_the_evaluator_leaves_a_cgroup_that_the_next_start_removes():
    evaluator = textwrap.dedent(
        """
        import time
        from trex.workloads.sandbox import Limits, Sandbox
        sandbox = Sandbox(Limits(wall_s=60), isolation="process", workers=1)
        sandbox.wait_ready()
        print(sandbox._cgroup.path, flush=True)
        time.sleep(120)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", evaluator], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    path = process.stdout.readline().strip()
    assert path and os.path.isdir(path)
    leaf = os.path.join(path, "worker-0", "cgroup.procs")
    assert open(leaf).read().split(), "the worker is not in its leaf"
    os.killpg(process.pid, signal.SIGKILL)  # the evaluator and, as a fallback for this test, its session
    process.wait()
    deadline = time.monotonic() + 10
    while os.path.exists(leaf) and open(leaf).read().split() and time.monotonic() < deadline:
        time.sleep(0.05)
    # the directory outlives its owner; the next run's start removes it (or another test worker's did)
    still_there = os.path.isdir(path)
    removed = remove_abandoned_cgroups(SUPPORT.parent)
    assert path in removed if still_there else path not in removed
    assert not os.path.exists(path)


@requires_cgroup
def test_the_cgroups_of_live_evaluators_are_left_alone():
    with Sandbox(FAST_LIMITS, isolation="process", workers=1) as sandbox:
        assert sandbox._cgroup.path not in remove_abandoned_cgroups(SUPPORT.parent)
        assert os.path.isdir(sandbox._cgroup.path)


def test_a_process_killed_by_the_cgroup_memory_limit_is_a_memory_limit_failure():
    raw = RawOutcome(
        timed_out=False,
        exit_code=None,
        signal=signal.SIGKILL,
        cpu_s=0.2,
        stderr="",
        events=[],
        setup_error=None,
        limits_cpu_s=10,
        limits_memory_bytes=1 << 30,
        oom_detail="killed by the cgroup memory limit (memory.max=1073741824)",
    )
    assert classify(raw) == (FailureKind.MEMORY_LIMIT, raw.oom_detail)
    without = RawOutcome(**{**raw.__dict__, "oom_detail": None})
    assert classify(without)[0] is FailureKind.KILLED


@requires_cgroup
@requires_controllers
def test_each_worker_leaf_carries_the_limits():
    limits = Limits(wall_s=20, cpu_s=5, memory_bytes=1 << 30, max_processes=40)
    with Sandbox(limits, isolation="process", workers=1) as sandbox:
        sandbox.wait_ready()
        leaf = os.path.join(sandbox._cgroup.path, "worker-0")
        memory = int(open(os.path.join(leaf, "memory.max")).read())
        assert memory >= limits.memory_bytes
        assert int(open(os.path.join(leaf, "pids.max")).read()) >= limits.max_processes
        assert open(os.path.join(leaf, "cpu.max")).read().split() == ["100000", "100000"]


@requires_cgroup
@requires_controllers
def test_resident_memory_beyond_the_cgroup_limit_is_a_memory_limit_failure():
    limits = Limits(wall_s=30, cpu_s=20, memory_bytes=2 << 30)
    with Sandbox(limits, isolation="process", workers=1, guard=False) as sandbox:
        sandbox.wait_ready()
        # tighter than the program's address space (2 GiB): the cgroup, not RLIMIT_AS, must stop it
        with open(os.path.join(sandbox._cgroup.path, "worker-0", "memory.max"), "w") as memory_max:
            memory_max.write(str(400 << 20))
        execution = sandbox.run(
            "block = bytearray(1200 << 20)\nblock[::4096] = b'x' * len(block[::4096])\nprint('ok')\n"
        )
        assert execution.failure is FailureKind.MEMORY_LIMIT, (execution.failure, execution.detail)
        assert "cgroup memory limit" in execution.detail and "ok" not in execution.stdout
        assert sandbox.run("print(2)").ok  # the next program runs (on a fresh worker if the old one died)


def test_a_leaf_gets_the_limit_files_of_a_program_and_rewrites_them_for_other_limits(tmp_path):
    # cgroupfs creates a leaf's files itself; a plain directory with them stands in for it here, so
    # what is written where is checked on every machine (the kernel's enforcement is tested above)
    leaf = tmp_path / "worker-0"
    leaf.mkdir()
    for name in ("memory.max", "memory.swap.max", "pids.max", "cpu.max"):
        (leaf / name).write_text("max\n")
    (leaf / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    limits = Limits(memory_bytes=1 << 30, work_dir_bytes=64 << 20, max_processes=40)
    run = RunCgroup(str(tmp_path), ("memory", "pids"), limits.to_json())  # no cpu controller delegated
    run.leaf("worker-0")
    assert int((leaf / "memory.max").read_text()) == (1 << 30) + (64 << 20) + WORKER_MEMORY_MARGIN
    assert (leaf / "memory.swap.max").read_text() == "0"
    assert (leaf / "pids.max").read_text() == str(40 + WORKER_TASK_MARGIN)
    assert (leaf / "cpu.max").read_text() == "max\n"  # its controller is not enabled: left alone
    bigger = Limits(memory_bytes=4 << 30, work_dir_bytes=64 << 20, max_processes=40)
    run.set_limits("worker-0", bigger.to_json())
    assert int((leaf / "memory.max").read_text()) == (4 << 30) + (64 << 20) + WORKER_MEMORY_MARGIN
    assert run.oom_kills("worker-0") == 2 and run.cpu_s() == 1.5
    assert "memory.max=" in run.limit_text("worker-0")
