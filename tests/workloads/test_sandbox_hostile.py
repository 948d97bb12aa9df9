"""Hostile programs are contained, reported as their failure kind, and the sandbox keeps working.

Each test runs under both isolation levels (`os` needs root; `process` runs anywhere), with the
audit-hook guard on as in production. `TestKernelAlone` repeats the attacks with the guard off
to show the `os` level contains them by itself: the guard is not what stops them there.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest
from workload_helpers import CPU_LOOP_LIMITS, FAST_LIMITS, ISOLATIONS, requires_os_isolation

import trex.errors
from trex.workloads.sandbox import FailureKind, Sandbox
from trex.workloads.sandbox.isolation import UID_BASE

GOOD = "print('Optimal objective value:', 6 * 7)"


def assert_still_works(sandbox: Sandbox) -> None:
    execution = sandbox.run(GOOD)
    assert execution.ok, execution.detail
    assert "Optimal objective value: 42" in execution.stdout


def marked_sandbox(isolation: str, **options) -> tuple[Sandbox, bytes]:
    """A sandbox whose programs carry a unique environment entry, to find what they leave behind
    (other tests may run sandboxes at the same time)."""
    mark = uuid.uuid4().hex
    return Sandbox(
        FAST_LIMITS, isolation=isolation, env={"TREX_TEST_MARK": mark}, **options
    ), f"TREX_TEST_MARK={mark}".encode()


def processes_left(mark: bytes) -> list[int]:
    """Live processes whose environment carries `mark`."""
    left = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if mark in environ.read().split(b"\0"):
                    left.append(int(entry))
        except OSError:
            continue
    return left


class _RecordingServer:
    """A TCP server on localhost that records every connection and byte it receives."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.socket.settimeout(0.2)
        self.port = self.socket.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.socket.accept()
            except OSError:
                continue
            with connection:
                connection.settimeout(1)
                try:
                    self.received.append(connection.recv(1024) or b"<connected>")
                except OSError:
                    self.received.append(b"<connected>")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.socket.close()


@pytest.fixture
def server():
    recording = _RecordingServer()
    yield recording
    recording.close()


@pytest.mark.parametrize("isolation", ISOLATIONS)
class TestHostilePrograms:
    def test_infinite_loop_stops_at_the_cpu_limit(self, sandboxes, isolation):
        sandbox = sandboxes(isolation)
        execution = sandbox.run("while True:\n    pass\n", limits=CPU_LOOP_LIMITS)
        assert execution.failure is FailureKind.CPU_LIMIT, execution.detail
        assert (
            execution.wall_s < CPU_LOOP_LIMITS.wall_s
        )  # the CPU limit stopped it, not the wall clock (no timing: shared cores)
        assert_still_works(sandbox)

    def test_fork_storm_is_refused_and_leaves_no_process(self, isolation):
        sandbox, mark = marked_sandbox(isolation)
        with sandbox:
            execution = sandbox.run("import os\nwhile True:\n    os.fork()\n")
            assert execution.failure is FailureKind.PROCESS_LIMIT, execution.detail
            assert processes_left(mark) == []
            assert_still_works(sandbox)

    def test_shell_fork_bomb_is_refused(self, isolation):
        sandbox, mark = marked_sandbox(isolation)
        with sandbox:
            execution = sandbox.run("import subprocess\nsubprocess.run(['/bin/bash', '-c', 'f() { f | f & }; f'])\n")
        assert execution.failure is FailureKind.PROCESS_LIMIT, execution.detail
        assert processes_left(mark) == []

    def test_50_gb_allocation_fails_with_memory_limit(self, sandboxes, isolation):
        sandbox = sandboxes(isolation)
        execution = sandbox.run("block = bytearray(50 * 1024**3)\nprint('allocated')\n")
        assert execution.failure is FailureKind.MEMORY_LIMIT, execution.detail
        assert "allocated" not in execution.stdout
        assert_still_works(sandbox)

    def test_writing_outside_the_work_directory_is_denied(self, sandboxes, isolation, tmp_path):
        target = tmp_path / "pwned.txt"
        sandbox = sandboxes(isolation)
        execution = sandbox.run(f"open({str(target)!r}, 'w').write('pwned')\n")
        assert execution.failure is FailureKind.FILE_DENIED, execution.detail
        assert not target.exists()

    def test_writing_inside_the_work_directory_is_allowed(self, sandboxes, isolation):
        program = "open('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read())\n"
        execution = sandboxes(isolation).run(program)
        assert execution.ok, execution.detail
        assert execution.stdout.strip() == "ok"

    def test_network_connection_is_denied_and_nothing_arrives(self, sandboxes, isolation, server):
        program = f"import socket\ns = socket.create_connection(('127.0.0.1', {server.port}), timeout=2)\ns.sendall(b'stolen')\n"
        execution = sandboxes(isolation).run(program)
        assert execution.failure is FailureKind.NETWORK_DENIED, execution.detail
        assert server.received == []

    def test_reading_the_evaluators_files_is_denied(self, sandboxes, isolation):
        source_file = trex.errors.__file__  # part of the evaluator's own installation
        program = f"print(open({source_file!r}).read())\n"
        execution = sandboxes(isolation).run(program)
        assert execution.failure is FailureKind.FILE_DENIED, execution.detail
        assert "class TrexError" not in execution.stdout + execution.stderr

    def test_reading_hidden_ground_truth_is_denied(self, isolation, tmp_path):
        answers = tmp_path / "answers.json"
        answers.write_text('{"answer": "SECRET-4242"}')
        with Sandbox(FAST_LIMITS, isolation=isolation, hide=[tmp_path]) as sandbox:
            execution = sandbox.run(
                f"import os\nprint(os.listdir({str(tmp_path)!r}))\nprint(open({str(answers)!r}).read())\n"
            )
        assert execution.failure is FailureKind.FILE_DENIED, execution.detail
        assert "SECRET-4242" not in execution.stdout + execution.stderr
        assert "answers.json" not in execution.stdout

    def test_killing_the_parent_is_denied_and_the_evaluator_survives(self, isolation):
        # The evaluator is a separate process here, so a failure would not take pytest down.
        evaluator = textwrap.dedent(
            f"""
            import json, os
            from trex.workloads.sandbox import Limits, Sandbox
            program = (
                "import os, signal\\n"
                "for target in ({{evaluator}}, os.getppid()):\\n"
                "    os.kill(target, signal.SIGKILL)\\n"
                "os.kill(-1, signal.SIGKILL)\\n"
            ).format(evaluator=os.getpid())
            with Sandbox(Limits(wall_s=20, cpu_s=5), isolation={isolation!r}) as sandbox:
                execution = sandbox.run(program)
                again = sandbox.run("print(7)")
            print(json.dumps({{"failure": str(execution.failure), "detail": execution.detail, "again": again.stdout}}))
            """
        )
        finished = subprocess.run([sys.executable, "-c", evaluator], capture_output=True, text=True, timeout=600)
        assert finished.returncode == 0, finished.stderr[-2000:]
        report = json.loads(finished.stdout.strip().splitlines()[-1])
        assert report["failure"] == FailureKind.SIGNAL_DENIED.value, report
        assert report["again"].strip() == "7"


@requires_os_isolation
class TestKernelAlone:
    """The `os` level without the guard: the kernel contains every attack by itself."""

    @pytest.fixture
    def bare(self, sandboxes):
        return sandboxes("namespaces", guard=False, seccomp=False)

    @pytest.fixture
    def marked(self):
        sandbox, mark = marked_sandbox("namespaces", guard=False, seccomp=False)
        with sandbox:
            yield sandbox, mark

    def test_fork_storm_hits_the_process_limit(self, marked):
        sandbox, mark = marked
        execution = sandbox.run("import os\nwhile True:\n    os.fork()\n")
        assert execution.failure is FailureKind.PROCESS_LIMIT, execution.detail
        assert processes_left(mark) == []

    def test_background_process_that_left_the_group_is_killed(self, marked):
        sandbox, mark = marked
        program = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\nprint('parent done')\n"
        execution = sandbox.run(program)
        assert execution.ok, execution.detail
        assert processes_left(mark) == []

    def test_memory_and_cpu_limits_hold(self, bare):
        assert bare.run("block = bytearray(50 * 1024**3)").failure is FailureKind.MEMORY_LIMIT
        assert bare.run("while True:\n    pass", limits=CPU_LOOP_LIMITS).failure is FailureKind.CPU_LIMIT

    @pytest.mark.parametrize("target", ["/tmp/trex-pwned", "/dev/shm/trex-pwned", "/etc/trex-pwned", "{repo}/pwned"])
    def test_file_system_is_read_only_outside_the_work_directory(self, bare, target):
        path = target.format(repo=os.path.dirname(os.path.dirname(trex.errors.__file__)))
        execution = bare.run(f"open({path!r}, 'w').write('x')")
        # read-only (EROFS), not ours (EACCES), or masked away entirely (ENOENT)
        assert execution.failure in (FailureKind.FILE_DENIED, FailureKind.RUNTIME_ERROR), execution.detail
        assert not os.path.exists(path)

    def test_evaluator_files_are_not_in_view(self, bare):
        execution = bare.run(f"print(open({trex.errors.__file__!r}).read())")
        assert "No such file or directory" in execution.detail
        assert "class TrexError" not in execution.stdout

    def test_only_system_directories_and_the_interpreter_are_visible(self, bare, tmp_path):
        (tmp_path / "answers.json").write_text("SECRET")
        program = f"import os\nprint(sorted(os.listdir('/tmp')))\nprint(os.path.exists({str(tmp_path)!r}))"
        execution = bare.run(program)
        assert execution.ok, execution.detail
        listing, exists = execution.stdout.splitlines()
        # its own base, and the way to the interpreter when that lives under /tmp (a checkout in /tmp)
        interpreter = {
            Path(p).resolve().relative_to("/tmp").parts[0]
            for p in (sys.prefix, sys.base_prefix, sys.executable)
            if Path(p).resolve().is_relative_to("/tmp")
        }
        entries = ast.literal_eval(listing)
        own = [e for e in entries if e.startswith("trex-sandbox-")]
        assert len(own) == 1 and set(entries) - set(own) <= interpreter, entries
        assert exists == "False"

    def test_there_is_no_network_even_to_localhost(self, bare, server):
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {server.port}), timeout=2).sendall(b'x')"
        execution = bare.run(program)
        assert execution.failure is FailureKind.NETWORK_DENIED, execution.detail
        assert server.received == []

    def test_signals_cannot_reach_outside_the_sandbox(self, bare):
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            execution = bare.run(
                f"import os, signal\nos.kill({sleeper.pid}, signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)"
            )
            assert not execution.ok
            assert sleeper.poll() is None  # still running
        finally:
            sleeper.send_signal(signal.SIGKILL)
            sleeper.wait()

    def test_program_runs_under_its_own_uid_and_sees_only_its_processes(self, bare):
        execution = bare.run(
            "import os\nprint(os.getuid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
        )
        assert execution.ok, execution.detail
        uid, pids = execution.stdout.split(" ", 1)
        assert int(uid) >= UID_BASE
        assert json.loads(pids) == [1, 2]  # the reaper and the program itself
