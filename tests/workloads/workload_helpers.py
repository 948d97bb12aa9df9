"""Shared by the workload tests: data locations, skip marks, limits, a fake OpenAI-compatible server, and
a character tokenizer for tiny local models.

(A module of its own rather than conftest.py: tests/conftest.py already owns that module name.)"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trex.workloads.sandbox import Limits
from trex.workloads.sandbox.isolation import InterpreterPaths, os_isolation_unavailable

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "or_bench"
ORLM_DIR = DATA_DIR / "orlm_predictions"

# Tight memory, file and process limits keep hostile programs quick to contain. The clocks are
# not tight: a test whose program must end by something else (a file cap, a denied syscall, the
# process limit) must not be ended by a clock first on a slow or loaded machine (CI saw a write
# that had to hit the file cap use 2.06 CPU s; a fresh interpreter importing Pyomo under
# `namespaces` used 1.0 CPU s at load 11 here). 10 CPU s is 10x the dearest such program.
FAST_LIMITS = Limits(wall_s=120, cpu_s=10, memory_bytes=2 << 30, file_size_bytes=8 << 20, max_processes=32)
# For the programs that must end on the CPU limit (infinite loops): 2 CPU s, and a wall clock far
# enough away that a loop niced on a loaded machine (1.3 CPU s in 20 s was seen) still reaches it.
CPU_LOOP_LIMITS = Limits(wall_s=120, cpu_s=2, memory_bytes=2 << 30, file_size_bytes=8 << 20, max_processes=32)


def _os_isolation_reason() -> str | None:
    import sys
    import tempfile

    from trex.workloads.sandbox import sandbox as sandbox_module

    launcher = str(Path(sandbox_module.__file__).with_name("launcher.py"))
    with tempfile.TemporaryDirectory() as work:
        os.chmod(work, 0o711)
        return os_isolation_unavailable(launcher, InterpreterPaths.of(sys.executable), work)


OS_UNAVAILABLE = _os_isolation_reason()
requires_os_isolation = pytest.mark.skipif(
    OS_UNAVAILABLE is not None, reason=f"namespaces isolation unavailable: {OS_UNAVAILABLE}"
)
requires_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason=f"benchmark data not found at {DATA_DIR}")


def _bwrap_reason() -> str | None:
    import sys

    from trex.workloads.sandbox.bwrap import bwrap_unavailable

    return bwrap_unavailable(sys.executable)


BWRAP_UNAVAILABLE = _bwrap_reason()
requires_bwrap = pytest.mark.skipif(
    BWRAP_UNAVAILABLE is not None, reason=f"bwrap isolation unavailable: {BWRAP_UNAVAILABLE}"
)

ISOLATIONS = [
    pytest.param("bwrap", marks=requires_bwrap),
    pytest.param("namespaces", marks=requires_os_isolation),
    "process",
]


class FakeOpenAIServer(ThreadingHTTPServer):
    """Serves /v1/models, /v1/chat/completions and /v1/completions on localhost.

    `script` is consumed one entry per completion request: an int is an HTTP error status to
    answer with, a float is a delay before answering normally, "garbage" answers non-JSON,
    None answers normally at once. A normal answer is `respond(prompt)` (default: an echo).
    Every request body is kept in `requests`.
    """

    daemon_threads = True

    def __init__(self, script=(), delay=0.0, retry_after=None, respond=None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = list(script)
        self.delay = delay
        self.retry_after = retry_after
        self.respond = respond or (lambda prompt: f"echo: {prompt}")
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def next_action(self):
        with self.lock:
            return self.script.pop(0) if self.script else None

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: FakeOpenAIServer

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "tiny"}]}).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.requests.append({"path": self.path, **body})
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        # The request stops counting as in flight *before* its response is
        # written: once the client has read the response it may start its next
        # request at once, and counting after the write would race with that
        # and report one request too many in flight.
        try:
            status, payload, headers = self._respond_to(body)
        finally:
            with server.lock:
                server.in_flight -= 1
        try:
            self._send(status, payload, headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on this request (timeout test)

    def _respond_to(self, body: dict) -> tuple[int, bytes, dict]:
        server = self.server
        action = server.next_action()
        if isinstance(action, int):
            headers = {"Retry-After": str(server.retry_after)} if server.retry_after is not None else {}
            return action, b'{"error": "scripted"}', headers
        if action == "garbage":
            return 200, b"<html>not json</html>", {}
        time.sleep(action if isinstance(action, float) else server.delay)
        if self.path == "/v1/chat/completions":
            prompt = body["messages"][-1]["content"]
            choice = {"message": {"role": "assistant", "content": server.respond(prompt)}}
        elif self.path == "/v1/completions":
            choice = {"text": server.respond(body["prompt"])}
        else:
            return 404, b"{}", {}
        return 200, json.dumps({"choices": [choice]}).encode(), {}


CHARACTER_VOCAB = ["<pad>", "<s>", "</s>", "<unk>"] + [chr(c) for c in range(32, 127)]


def character_tokenizer(words: list[str]):
    """A word-level tokenizer over single characters (ids 0-3: pad, bos, eos, unk), built here: tiny random
    models need a tokenizer that `TransformersClient` loads like any local one, and nothing is downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
