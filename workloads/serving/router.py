"""The live OpenAI-compatible router: real workers behind it, the simulator's schedulers inside it.

`POST /v1/completions` and `/v1/chat/completions` (streamed or not) go to the worker the scheduler
picks from the router's live view of each worker (`InstanceLoad`: what it dispatched there and has
not seen finish). Workers are vLLM / SGLang / vllm-ascend servers in production and `trex serve
worker` processes in tests.

Failure handling - every request ends as exactly one of completed, failed (the client gets an
OpenAI-shaped error naming each worker tried and what went wrong) or rejected (429, backpressure):

* a worker that refuses the connection, answers 5xx, returns a body that is not an OpenAI response
  (garbage), or stays silent past `request_timeout` (hang) is marked down and the request is retried
  on another worker, while nothing has been streamed to the client yet (at most `retries` times);
* a stream that breaks after tokens reached the client ends with an error event, not silence;
* a background health check (`GET /health`) brings workers back up;
* past `max_in_flight` requests the router answers 429 with Retry-After instead of queueing without
  bound.

Capacity: the trex and weighted_rr schedulers need each worker's latency model. Give it per worker
(`URL@profile.json`, written by `trex serve profile` or a plan) or let the router probe: a few
timed requests per worker fitted by least squares (total = c0 + c1 * prompt + c2 * output tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

import numpy as np

from trex.workloads.serving.deployment import InstanceSpec
from trex.workloads.serving.errors import ServingError, WorkerError
from trex.workloads.serving.http import (
    Endpoint,
    error_payload,
    open_request,
    read_request,
    request_json,
    response_head,
    write_json,
)
from trex.workloads.serving.instance_model import EngineLimits
from trex.workloads.serving.kv_cache import KVLayout
from trex.workloads.serving.latency_fit import LatencyModel, non_negative_lstsq
from trex.workloads.serving.schedulers import InstanceLoad, RequestInfo, Scheduler
from trex.workloads.serving.worker import LOOPBACK, max_tokens_of, prompt_text

UNKNOWN_KV = KVLayout((), "unknown", "bf16")
PROBES = ((8, 4), (64, 4), (8, 24), (64, 24), (32, 12))  # (prompt words, max_tokens)


def worker_spec(url: str, latency: LatencyModel, limits: EngineLimits | None = None) -> InstanceSpec:
    """A worker as the schedulers see it: its latency model and engine limits (from its profile; batch 1
    when unknown - a probed worker); the KV cache unknown (unbounded)."""
    return InstanceSpec(
        url, "remote", "remote", 1, latency, UNKNOWN_KV, float("inf"), limits or EngineLimits(max_num_seqs=1)
    )


async def probe_worker(endpoint: Endpoint, probes=PROBES, timeout: float = 60.0) -> LatencyModel:
    """Time a few requests of different prompt and output lengths and fit the worker's latencies."""
    rows, seconds = [], []
    for words, max_tokens in probes:
        start = time.perf_counter()
        status, body = await request_json(
            endpoint,
            "POST",
            "/v1/completions",
            {"prompt": " ".join(f"w{i}" for i in range(words)), "max_tokens": max_tokens},
            timeout,
        )
        if status != 200 or not isinstance(body, dict) or "choices" not in body:
            raise WorkerError(f"probing {endpoint.url} failed: status {status}, body {str(body)[:120]}")
        usage = body.get("usage", {})
        rows.append([1.0, float(usage.get("prompt_tokens", words)), float(usage.get("completion_tokens", max_tokens))])
        seconds.append(time.perf_counter() - start)
    coef = non_negative_lstsq(np.array(rows), np.array(seconds))
    return LatencyModel((float(coef[0]), float(coef[1]), 0.0), (float(coef[2]), 0.0, 0.0), f"probed {endpoint.url}")


@dataclass
class WorkerSlot:
    endpoint: Endpoint
    load: InstanceLoad
    completed: int = 0
    failures: int = 0
    last_error: str = ""


@dataclass
class RouterStats:
    received: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0
    retried: int = 0
    in_flight: int = 0
    latencies_s: list = field(default_factory=list)


class _Garbage(Exception):
    pass


class Router:
    def __init__(
        self,
        workers: list[tuple[Endpoint, InstanceSpec]],
        scheduler: Scheduler,
        *,
        request_timeout: float = 60.0,
        retries: int = 2,
        max_in_flight: int = 256,
        health_interval: float = 2.0,
    ):
        if not workers:
            raise ServingError("the router needs at least one worker (--workers URL,URL,...)")
        self.slots = [WorkerSlot(endpoint, InstanceLoad(spec)) for endpoint, spec in workers]
        self.scheduler = scheduler
        self.request_timeout, self.retries = request_timeout, retries
        self.max_in_flight, self.health_interval = max_in_flight, health_interval
        self.stats = RouterStats()
        self._health_task: asyncio.Task | None = None
        self._server: asyncio.Server | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
        if host not in LOOPBACK:
            raise ServingError(f"the router listens on loopback only (got host {host!r}); use 127.0.0.1")
        self._server = await asyncio.start_server(self.handle, host, port)
        if self.health_interval > 0:
            self._health_task = asyncio.create_task(self._health_loop())
        return self._server

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._health_task:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self._server:
            self._server.close()
            await self._server.wait_closed()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            await asyncio.gather(*(self._check(slot) for slot in self.slots))

    async def _check(self, slot: WorkerSlot) -> None:
        try:
            status, body = await request_json(slot.endpoint, "GET", "/health", timeout=min(2.0, self.request_timeout))
            slot.load.healthy = status == 200 and isinstance(body, dict)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ServingError):
            slot.load.healthy = False

    # -- serving ------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        s = self.stats
        return {
            "received": s.received,
            "completed": s.completed,
            "failed": s.failed,
            "rejected": s.rejected,
            "retried": s.retried,
            "in_flight": s.in_flight,
            "scheduler": self.scheduler.name,
            "workers": [
                {
                    "url": slot.endpoint.url,
                    "healthy": slot.load.healthy,
                    "assigned": slot.load.assigned,
                    "completed": slot.completed,
                    "failures": slot.failures,
                    "in_flight": slot.load.in_flight,
                    "last_error": slot.last_error,
                }
                for slot in self.slots
            ],
        }

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = await read_request(reader, timeout=30.0)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ServingError):
                return
            if request.method == "GET" and request.path == "/health":
                healthy = sum(slot.load.healthy for slot in self.slots)
                await write_json(
                    writer,
                    200 if healthy else 503,
                    {"status": "ok" if healthy else "no healthy worker", "healthy_workers": healthy},
                )
            elif request.method == "GET" and request.path == "/trex/stats":
                await write_json(writer, 200, self.snapshot())
            elif request.method == "POST" and request.path in ("/v1/completions", "/v1/chat/completions"):
                await self._route(request, writer)
            else:
                await write_json(
                    writer, 404, error_payload(f"no route {request.method} {request.path}", "not_found", 404)
                )
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _route(self, request, writer: asyncio.StreamWriter) -> None:
        self.stats.received += 1
        if self.stats.in_flight >= self.max_in_flight:
            self.stats.rejected += 1
            await write_json(
                writer,
                429,
                error_payload(
                    f"router at capacity: {self.stats.in_flight} requests in flight (max_in_flight "
                    f"{self.max_in_flight}); retry later",
                    "rate_limit_exceeded",
                    429,
                ),
                {"Retry-After": "1"},
            )
            return
        try:
            payload = request.json()
            if not isinstance(payload, dict):
                raise ServingError("the body must be a JSON object")
            chat = request.path.endswith("chat/completions")
            info = RequestInfo(max(1, len(prompt_text(payload, chat).split())), max_tokens_of(payload))
        except ServingError as error:
            self.stats.failed += 1
            await write_json(writer, 400, error_payload(str(error), "invalid_request_error", 400))
            return
        self.scheduler.observe(info)
        self.stats.in_flight += 1
        start = time.perf_counter()
        try:
            ok = await self._forward(request.path, payload, info, writer)
        finally:
            self.stats.in_flight -= 1
        if ok:
            self.stats.completed += 1
            self.stats.latencies_s.append(time.perf_counter() - start)
        else:
            self.stats.failed += 1

    async def _forward(self, path: str, payload: dict, info: RequestInfo, writer: asyncio.StreamWriter) -> bool:
        tried: set[int] = set()
        errors: list[str] = []
        for attempt in range(self.retries + 1):
            loads = [slot.load for slot in self.slots]
            saved = [load.healthy for load in loads]
            for i in tried:
                loads[i].healthy = False
            try:
                index = self.scheduler.choose(info, loads)
            except ServingError:
                break
            finally:
                for load, healthy in zip(loads, saved):
                    load.healthy = healthy
            slot = self.slots[index]
            tried.add(index)
            if attempt:
                self.stats.retried += 1
            slot.load.dispatch(info)
            started = [False]
            timeout = self.request_timeout  # this attempt's: the error names the limit it had
            try:
                await self._attempt(slot, path, payload, info, writer, started, timeout)
                slot.completed += 1
                return True
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ServingError, _Garbage) as error:
                reason = _describe(error, timeout)
                slot.failures += 1
                slot.last_error = reason
                slot.load.healthy = False  # until the health check sees it answer again
                errors.append(f"{slot.endpoint.url}: {reason}")
                if started[0]:  # tokens already reached the client: end the stream with an error event
                    with contextlib.suppress(ConnectionError):
                        event = error_payload(
                            f"worker {slot.endpoint.url} failed mid-stream: {reason}", "worker_error", 502
                        )
                        writer.write(f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode())
                        await writer.drain()
                    return False
            finally:
                self._finish(slot.load, info, started[0])
        timeouts = all("no answer within" in e for e in errors) and errors
        message = (
            ("no worker could serve the request: " + "; ".join(errors))
            if errors
            else "no healthy worker to serve the request"
        )
        await write_json(
            writer, 504 if timeouts else 502, error_payload(message, "worker_error", 504 if timeouts else 502)
        )
        return False

    def _finish(self, load: InstanceLoad, info: RequestInfo, started: bool) -> None:
        if started:
            load.running -= 1
        else:
            load.waiting -= 1
            load.waiting_prompt_tokens -= info.prompt_tokens
            load.waiting_pairs -= info.prompt_tokens**2
        load.remaining_output_tokens -= info.expected_output_tokens

    @staticmethod
    def _started(load: InstanceLoad, info: RequestInfo) -> None:
        load.waiting -= 1
        load.waiting_prompt_tokens -= info.prompt_tokens
        load.waiting_pairs -= info.prompt_tokens**2
        load.running += 1

    async def _attempt(
        self,
        slot: WorkerSlot,
        path: str,
        payload: dict,
        info: RequestInfo,
        writer: asyncio.StreamWriter,
        started: list[bool],
        timeout: float,
    ) -> None:
        stream = bool(payload.get("stream", False))
        response = await open_request(slot.endpoint, "POST", path, payload, timeout)
        try:
            if response.status >= 500:
                body = await response.read_body(timeout)
                raise WorkerError(f"answered {response.status}: {body[:120]!r}")
            if not stream or response.status != 200:
                body = await response.read_body(timeout)
                try:
                    parsed = json.loads(body)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    raise _Garbage(f"returned a body that is not JSON: {body[:80]!r}") from None
                if response.status == 200 and not (
                    isinstance(parsed, dict) and isinstance(parsed.get("choices"), list)
                ):
                    raise _Garbage(f"returned JSON without `choices`: {body[:80]!r}")
                await write_json(writer, response.status, parsed)  # 4xx: the client's request was wrong; passed through
                return
            done = False
            async for line in response.lines(timeout):
                text = line.decode(errors="replace").strip()
                if not text:
                    continue
                if not text.startswith("data:"):
                    raise _Garbage(f"sent a stream line that is not server-sent events: {text[:80]!r}")
                data = text[5:].strip()
                if data != "[DONE]":
                    try:
                        json.loads(data)
                    except json.JSONDecodeError:
                        raise _Garbage(f"sent an event that is not JSON: {data[:80]!r}") from None
                if not started[0]:
                    writer.write(response_head(200, "text/event-stream", extra={"Cache-Control": "no-cache"}))
                    started[0] = True
                    self._started(slot.load, info)
                writer.write(f"data: {data}\n\n".encode())
                await writer.drain()
                if data == "[DONE]":
                    done = True
                    break
            if not done:
                raise WorkerError("closed the stream before [DONE]")
        finally:
            response.close()


def _describe(error: BaseException, timeout: float) -> str:
    if isinstance(error, asyncio.TimeoutError):
        return f"no answer within {timeout:g} s (hung?)"
    if isinstance(error, asyncio.IncompleteReadError):
        return "closed the connection mid-response"
    if isinstance(error, OSError):
        return f"unreachable ({error.strerror or error})"
    return str(error)
