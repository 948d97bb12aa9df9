"""The live router in front of real CPU workers (tiny random-init models): OpenAI endpoints, streaming,
failures retried or reported, backpressure, every request accounted for. Everything is bounded:
loopback sockets, short timeouts, a handful of requests."""

from __future__ import annotations

import asyncio
import json

import pytest

from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.http import Endpoint, open_request, request_json
from trex.workloads.serving.latency_fit import LatencyModel
from trex.workloads.serving.live_cli import build_router, parse_workers
from trex.workloads.serving.router import Router, worker_spec
from trex.workloads.serving.schedulers import make_scheduler
from trex.workloads.serving.worker import TinyEngine, Worker, WorkerModelConfig

FLAT = LatencyModel((0.001, 1e-5, 0.0), (0.002, 0.0, 0.0))


@pytest.fixture(scope="module")
def engine():
    return TinyEngine(WorkerModelConfig(layers=1, hidden=32, heads=2, vocab=64), threads=1)


async def start_worker(engine) -> tuple[Worker, asyncio.Server, Endpoint]:
    worker = Worker(engine)
    server = await worker.start()
    return worker, server, Endpoint("127.0.0.1", server.sockets[0].getsockname()[1])


def relaxed(router_holder: list):
    """A broken worker's hook: once it has a request, the router's later attempts (the retry on the healthy worker)
    get a generous timeout, so a slow, loaded machine cannot make the healthy worker miss the short one the broken
    worker's attempt was given (each attempt reads the router's timeout when it starts)."""

    def relax():
        for router in router_holder:
            router.request_timeout = 60.0

    return relax


async def start_fake(behaviour: str, on_request=None) -> tuple[asyncio.Server, Endpoint]:
    """A broken worker: `garbage` answers 200 with a non-JSON body, `hang` reads the request and never answers."""

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        if on_request is not None:
            on_request()
        if behaviour == "garbage":
            body = b"<html>proxy error</html>"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            writer.close()
        else:
            await asyncio.sleep(30)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, Endpoint("127.0.0.1", server.sockets[0].getsockname()[1])


async def start_router(endpoints, scheduler="trex", **options) -> Router:
    options.setdefault("health_interval", 0)
    router = Router([(e, worker_spec(e.url, FLAT)) for e in endpoints], make_scheduler(scheduler), **options)
    await router.start()
    return router


def complete(router: Router, prompt: str = "hello there world", max_tokens: int = 4, **extra):
    return request_json(
        Endpoint("127.0.0.1", router.port),
        "POST",
        "/v1/completions",
        {"prompt": prompt, "max_tokens": max_tokens, **extra},
        20,
    )


def test_completions_chat_and_streaming_through_the_router(engine):
    async def scenario():
        worker, server, endpoint = await start_worker(engine)
        router = await start_router([endpoint])
        try:
            status, body = await complete(router)
            assert status == 200 and body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
            assert len(body["choices"][0]["text"].split()) == 4
            status, chat = await request_json(
                Endpoint("127.0.0.1", router.port),
                "POST",
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
                20,
            )
            assert status == 200 and chat["choices"][0]["message"]["role"] == "assistant"
            response = await open_request(
                Endpoint("127.0.0.1", router.port),
                "POST",
                "/v1/completions",
                {"prompt": "a b", "max_tokens": 5, "stream": True},
                20,
            )
            events = [line.decode().strip() async for line in response.lines(20) if line.strip()]
            response.close()
            assert events[-1] == "data: [DONE]"
            pieces = [
                t for e in events[:-1] if (t := json.loads(e[5:])["choices"][0]["text"])
            ]  # the last event only finishes
            assert len(pieces) == 5 and all(p.strip().startswith("t") for p in pieces)
            stats = router.snapshot()
            assert stats["completed"] == 3 and stats["failed"] == 0 and stats["in_flight"] == 0
            assert stats["workers"][0]["in_flight"] == 0
        finally:
            await router.close()
            server.close()
            worker.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("behaviour", ["garbage", "hang"])
def test_broken_worker_requests_are_retried_on_a_healthy_one(engine, behaviour):
    async def scenario():
        worker, server, good = await start_worker(engine)
        holder: list = []
        bad_server, bad = await start_fake(behaviour, on_request=relaxed(holder))
        router = await start_router([bad, good], scheduler="round_robin", request_timeout=1.0)
        holder.append(router)
        try:
            results = [await complete(router) for _ in range(4)]
            assert all(status == 200 for status, _ in results)
            stats = router.snapshot()
            assert stats["completed"] == 4 and stats["retried"] >= 1
            broken = stats["workers"][0]
            assert broken["failures"] >= 1 and not broken["healthy"]
            assert ("not JSON" if behaviour == "garbage" else "no answer within 1 s") in broken["last_error"]
        finally:
            await router.close()
            bad_server.close()
            server.close()
            worker.close()

    asyncio.run(scenario())


def test_a_worker_whose_engine_fails_answers_500_and_the_router_retries(engine):
    class Broken:
        def __call__(self, **_):
            raise RuntimeError("out of memory")

    broken_engine = TinyEngine(engine.config, threads=1)
    broken_engine.model = Broken()

    async def scenario():
        _, good_server, good = await start_worker(engine)
        broken_worker, broken_server, broken = await start_worker(broken_engine)
        router = await start_router([broken, good], scheduler="round_robin")
        try:
            for stream in (False, True):  # before any token, streamed or not: a 500 naming the failure
                status, direct = await request_json(
                    broken, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": stream}, 20
                )
                assert status == 500 and "out of memory" in direct["error"]["message"]
            results = [await complete(router) for _ in range(3)]
            assert [status for status, _ in results] == [200, 200, 200]
            stats = router.snapshot()
            assert stats["completed"] == 3 and stats["failed"] == 0 and stats["retried"] == 1
            assert stats["workers"][0]["failures"] == 1 and "answered 500" in stats["workers"][0]["last_error"]
        finally:
            await router.close()
            for server in (good_server, broken_server):
                server.close()
            broken_worker.close()

    asyncio.run(scenario())


def test_when_every_worker_fails_the_client_gets_an_error_naming_them():
    async def scenario():
        garbage_server, garbage = await start_fake("garbage")
        hang_server, hang = await start_fake("hang")
        router = await start_router([garbage, hang], request_timeout=0.5, retries=1)
        try:
            status, body = await complete(router)
            assert status == 502
            message = body["error"]["message"]
            assert (
                garbage.url in message
                and hang.url in message
                and "not JSON" in message
                and "no answer within 0.5 s" in message
            )
            status, body = await complete(router)  # both are marked down now
            assert status == 502 and "no healthy worker" in body["error"]["message"]
            stats = router.snapshot()
            assert stats["received"] == 2 == stats["failed"] and stats["completed"] == 0 and stats["in_flight"] == 0
        finally:
            await router.close()
            garbage_server.close()
            hang_server.close()

    asyncio.run(scenario())


def test_backpressure_rejects_beyond_max_in_flight(engine):
    async def scenario():
        worker, server, endpoint = await start_worker(engine)
        router = await start_router([endpoint], max_in_flight=1)
        try:
            results = await asyncio.gather(*(complete(router, max_tokens=24) for _ in range(4)))
            statuses = sorted(status for status, _ in results)
            assert 429 in statuses and 200 in statuses
            rejected = [body for status, body in results if status == 429]
            assert "router at capacity" in rejected[0]["error"]["message"]
            stats = router.snapshot()
            assert stats["completed"] + stats["rejected"] == stats["received"] == 4
        finally:
            await router.close()
            server.close()
            worker.close()

    asyncio.run(scenario())


def test_bad_client_requests_get_400_and_the_router_probes_workers(engine):
    async def scenario():
        worker, server, endpoint = await start_worker(engine)
        router = await build_router(parse_workers(endpoint.url), "trex", health_interval=0)
        await router.start()
        try:
            spec = router.slots[0].load.spec
            assert spec.latency.source.startswith("probed") and spec.latency.decode[0] > 0
            status, body = await complete(router, max_tokens=0)
            assert status == 400 and "max_tokens" in body["error"]["message"]
        finally:
            await router.close()
            server.close()
            worker.close()

    asyncio.run(scenario())


def test_router_and_workers_listen_on_loopback_only(engine):
    async def scenario():
        with pytest.raises(ServingError, match="loopback only"):
            await Worker(engine).start("0.0.0.0", 0)

    asyncio.run(scenario())
    with pytest.raises(ServingError, match="http://HOST:PORT"):
        parse_workers("ftp://x")


async def start_streaming_fake(behaviour: str, on_request=None) -> tuple[asyncio.Server, Endpoint]:
    """A worker that opens a stream and then breaks: `sse_garbage` sends a line that is not an event before any
    token, `tokens_then_hang` sends two tokens and goes silent, `tokens_then_garbage` two tokens and then a
    line that is not an event."""

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        if on_request is not None:
            on_request()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        if behaviour == "sse_garbage":
            writer.write(b"<html>proxy error</html>\n\n")
        else:
            for i in range(2):
                event = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f" t{i}"}]}
                writer.write(f"data: {json.dumps(event)}\n\n".encode())
            if behaviour == "tokens_then_garbage":
                writer.write(b"Traceback (most recent call last):\n\n")
        await writer.drain()
        if behaviour == "tokens_then_hang":
            await asyncio.sleep(30)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, Endpoint("127.0.0.1", server.sockets[0].getsockname()[1])


async def stream_events(router: Router, max_tokens: int = 3) -> list[str]:
    response = await open_request(
        Endpoint("127.0.0.1", router.port),
        "POST",
        "/v1/completions",
        {"prompt": "a b c", "max_tokens": max_tokens, "stream": True},
        20,
    )
    events = [line.decode().strip() async for line in response.lines(20) if line.strip()]
    response.close()
    return events


def test_a_stream_that_is_garbage_before_any_token_is_retried_on_a_healthy_worker(engine):
    async def scenario():
        worker, server, good = await start_worker(engine)
        holder: list = []
        bad_server, bad = await start_streaming_fake("sse_garbage", on_request=relaxed(holder))
        router = await start_router([bad, good], scheduler="round_robin", request_timeout=2.0)
        holder.append(router)
        try:
            events = await stream_events(router)
            assert events[-1] == "data: [DONE]" and not any("error" in e for e in events)
            stats = router.snapshot()
            assert stats["completed"] == 1 and stats["retried"] == 1 and stats["failed"] == 0
            assert "not server-sent events" in stats["workers"][0]["last_error"]
            assert stats["in_flight"] == 0 and all(w["in_flight"] == 0 for w in stats["workers"])
        finally:
            await router.close()
            bad_server.close()
            server.close()
            worker.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("behaviour", ["tokens_then_hang", "tokens_then_garbage"])
def test_a_stream_that_breaks_after_tokens_ends_with_an_error_event_and_is_counted_failed(engine, behaviour):
    """Tokens already reached the client, so the request cannot move: the client gets an error event naming the
    worker and the cause, then [DONE]; the router counts it failed, frees its slot, and serves the next request
    on the healthy worker."""

    async def scenario():
        worker, server, good = await start_worker(engine)
        holder: list = []
        bad_server, bad = await start_streaming_fake(behaviour, on_request=relaxed(holder))
        router = await start_router([bad, good], scheduler="round_robin", request_timeout=0.5)
        holder.append(router)
        try:
            events = await stream_events(router)
            assert events[-1] == "data: [DONE]"
            tokens = [e for e in events[:-1] if "choices" in e]
            assert len(tokens) == 2  # what the worker sent before it broke reached the client
            error = json.loads(events[-2][5:])["error"]
            cause = "no answer within 0.5 s" if behaviour == "tokens_then_hang" else "not server-sent events"
            assert bad.url in error["message"] and "mid-stream" in error["message"] and cause in error["message"]
            status, _ = await complete(router)  # the broken worker is down: the next request goes to the good one
            assert status == 200
            stats = router.snapshot()
            assert stats["received"] == 2 and stats["failed"] == 1 and stats["completed"] == 1
            assert stats["in_flight"] == 0 and all(w["in_flight"] == 0 for w in stats["workers"])
            assert stats["workers"][0]["failures"] == 1 and not stats["workers"][0]["healthy"]
        finally:
            await router.close()
            bad_server.close()
            server.close()
            worker.close()

    asyncio.run(scenario())
