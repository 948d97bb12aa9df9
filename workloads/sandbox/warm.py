"""The host side of warm workers: a pool of `worker.py` processes, each in its own container.

`WarmPool.run` hands one program to an idle worker and waits for its answer; `Sandbox.run` turns
that into an `Execution`. Workers start in parallel in the background when the pool is created
(the first programs wait for them), each in a session of its own (the terminal's Ctrl-C never
reaches a program), each dying with the evaluator (`--die-with-parent` under bwrap, a
parent-death signal otherwise). A worker that dies or stops answering is replaced; the run it was
doing is classified as the program's doing (it was the only thing running there).
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from trex.workloads.sandbox.interruption import RunInterrupted
from trex.workloads.sandbox.limits import SandboxConfigError

# Extra seconds past a program's wall-clock limit before the host gives up on its worker.
ANSWER_GRACE_S = 10.0
STARTUP_TIMEOUT_S = 120.0


@dataclass
class WorkerAnswer:
    """What a worker reported for one run (see worker.py), or why it reported nothing."""

    status: dict
    worker_died: str | None = None  # set when the worker died or hung during the run


class _Spawner:
    """Starts every worker from one long-lived thread. A parent-death signal (bwrap's
    --die-with-parent, the worker's own) fires when the *thread* that started the process ends,
    so workers must not be started from the short-lived threads that wait for them."""

    def __init__(self) -> None:
        self._requests: queue.Queue = queue.Queue()
        threading.Thread(target=self._serve, name="trex-sandbox-spawner", daemon=True).start()

    def _serve(self) -> None:
        while True:
            argv, log_path, reply = self._requests.get()
            try:
                with open(log_path, "ab") as log:
                    reply.put(
                        subprocess.Popen(
                            argv,
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            stderr=log,
                            start_new_session=True,
                            close_fds=True,
                        )
                    )
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                reply.put(error)

    def spawn(self, argv: list[str], log_path: str) -> subprocess.Popen:
        reply: queue.Queue = queue.Queue(maxsize=1)
        self._requests.put((argv, log_path, reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise SandboxConfigError(f"cannot start a sandbox worker: {result}")
        return result


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _spawn(argv: list[str], log_path: str) -> subprocess.Popen:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
    return _spawner.spawn(argv, log_path)


class WarmWorker:
    """One worker process and its request/answer pipes."""

    def __init__(self, argv: list[str], io_dir: str, log_path: str, slot: int = 0):
        self.slot = slot  # its place in the pool (its cgroup leaf is named after it)
        self.io_dir = io_dir
        self.log_path = log_path
        self.process = _spawn(argv, log_path)
        self._answers = self.process.stdout
        ready = self._read_answer(STARTUP_TIMEOUT_S)
        if not ready or not ready.get("ready"):
            self.kill()
            raise SandboxConfigError(f"a sandbox worker failed to start: {self._log_tail()}")
        self.preloaded = tuple(ready.get("preloaded", ()))
        self.seccomp = bool(ready.get("seccomp"))
        self.seccomp_error = ready.get("seccomp_error")

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                return log.read()[-600:].decode(errors="replace").strip() or f"exit {self.process.poll()}"
        except OSError:
            return f"exit {self.process.poll()}"

    def _read_answer(self, timeout: float) -> dict | None:
        # `kill` (an abort from another thread) closes the answer stream under a waiting reader: select or
        # readline then raise ValueError on the closed file, which means the same as EOF - no answer
        try:
            ready, _, _ = select.select([self._answers], [], [], timeout)
            if not ready:
                return None
            line = self._answers.readline()
        except (ValueError, OSError):
            return None
        if not line:
            return None
        try:
            answer = json.loads(line)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def run(self, request: dict, wall_s: float) -> WorkerAnswer:
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return WorkerAnswer({}, worker_died=f"the worker had died ({self._log_tail()})")
        answer = self._read_answer(wall_s + ANSWER_GRACE_S)
        if answer is None:
            alive = self.process.poll() is None
            self.kill()
            reason = "the worker stopped answering" if alive else "the worker died during the run"
            return WorkerAnswer({}, worker_died=reason)
        return WorkerAnswer(answer)

    def stop(self) -> None:
        """End an idle worker: its request channel closes, it exits (so its CPU time is accounted
        to its parent like any reaped child's); killed if it does not within a few seconds."""
        try:
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.kill()
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class WarmPool:
    """`size` workers made by `start(slot) -> WarmWorker`; `run` is thread-safe."""

    def __init__(self, size: int, start):
        if size < 1:
            raise SandboxConfigError(f"a warm pool needs at least one worker, got {size}")
        self._start = start
        self._idle: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._busy: dict[int, WarmWorker] = {}
        self._closed = False
        self._startup_error: BaseException | None = None
        self.size = size
        self.info: dict = {}
        self.worker_cpu_s: dict[int, float] = {}  # slot -> CPU seconds its current worker has used
        self._retired_cpu_s = 0.0  # of workers replaced since
        threads = [threading.Thread(target=self._start_into_pool, args=(slot,), daemon=True) for slot in range(size)]
        for thread in threads:
            thread.start()
        self._starting = threads

    def _start_into_pool(self, slot: int) -> None:
        try:
            worker = self._start(slot)
        except BaseException as error:  # noqa: BLE001 - reported to the first run that waits
            self._startup_error = error
            self._idle.put((slot, None))
            return
        self.info = {"preloaded": worker.preloaded, "seccomp": worker.seccomp, "seccomp_error": worker.seccomp_error}
        self._idle.put((slot, worker))

    def wait_ready(self) -> None:
        """Block until every worker has started; raise the first startup failure."""
        for thread in self._starting:
            thread.join()
        if self._startup_error is not None:
            raise self._startup_error

    def run(self, request: dict, wall_s: float, prepare) -> WorkerAnswer:
        """Run `request` on an idle worker; `prepare(worker)` runs first (it writes the io files)."""
        slot, worker = self._idle.get()
        try:
            if self._closed:
                raise RunInterrupted("the sandbox was stopped (interrupted) before this program started")
            if worker is None or not worker.alive:
                if worker is None and self._startup_error is not None:
                    raise self._startup_error
                worker = self._start(slot)
            with self._lock:
                self._busy[slot] = worker
            prepare(worker)
            try:
                answer = worker.run(request, wall_s)
            except BaseException:  # e.g. KeyboardInterrupt while waiting: the worker's state is unknown
                worker.kill()
                worker = None
                raise
            finally:
                with self._lock:
                    self._busy.pop(slot, None)
                    closed = self._closed
            if closed:
                raise RunInterrupted("the program was stopped by an interrupt before it ended; it is not a result")
            if "worker_cpu_s" in answer.status:
                self.worker_cpu_s[slot] = float(answer.status["worker_cpu_s"])
            if answer.worker_died is None and answer.status.get("id") != request["id"]:
                answer = WorkerAnswer({}, worker_died=f"the worker answered for run {answer.status.get('id')!r}")
            if answer.worker_died is not None:
                worker.kill()
                worker = None
                self._retired_cpu_s += self.worker_cpu_s.pop(slot, 0.0)
            return answer
        finally:
            self._idle.put((slot, worker))

    @property
    def cpu_s(self) -> float:
        """CPU seconds the workers reported so far (start-up, programs, clean-up), as of their last answer."""
        return self._retired_cpu_s + sum(self.worker_cpu_s.values())

    def abort(self) -> None:
        """Kill every worker in flight (their programs die with them); later runs are refused."""
        with self._lock:
            self._closed = True
            busy = list(self._busy.values())
        for worker in busy:
            worker.kill()

    def close(self) -> None:
        self.abort()
        for thread in self._starting:
            thread.join(timeout=STARTUP_TIMEOUT_S)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                _, worker = self._idle.get_nowait()
            except queue.Empty:
                break
            if worker is not None:
                worker.stop()
