"""An OpenAI-compatible CPU worker serving a tiny random-init transformers model (loopback only).

It stands in for a vLLM / SGLang worker in tests and benches: a Llama-shaped `transformers` model
built locally with random weights (never downloaded), greedy decoding with a KV cache, served by
continuous batching (`batching.BatchingEngine`: prefill-first, up to `max_num_seqs` sequences
decoding together; `max_num_seqs=1` serves one request at a time) on `threads` intra-op threads.
Workers of different sizes or thread counts give the router instances of genuinely unequal capacity.

Endpoints: GET /health, GET /trex/timeline (the engine's steps and finished requests), GET /v1/models, POST /v1/completions and /v1/chat/completions (with
`"stream": true`, server-sent events ending in `data: [DONE]`). Text is tokenized as whitespace
words hashed into the vocabulary; output tokens print as `t<id>`. Generation runs for `max_tokens`
tokens (as benchmarks run vLLM with ignore_eos), so the work per request is what it asks for.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
import uuid
import zlib
from dataclasses import dataclass

from trex.workloads.serving.batching import BatchedRequest, BatchingEngine
from trex.workloads.serving.errors import ServingError
from trex.workloads.serving.host_memory import keep_freed_memory
from trex.workloads.serving.http import error_payload, read_request, response_head, write_json

MAX_TOKENS_LIMIT = 4096
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class WorkerModelConfig:
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    vocab: int = 512
    seed: int = 0

    def describe(self) -> str:
        shape = f"{self.layers} layers, hidden {self.hidden}, {self.heads} heads, vocab {self.vocab}"
        return f"tiny Llama: {shape} (random init)"


def build_worker_model(config: WorkerModelConfig):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if config.hidden % config.heads:
        raise ServingError(f"--hidden {config.hidden} must be a multiple of --heads {config.heads}")
    torch.manual_seed(config.seed)
    model_config = LlamaConfig(
        vocab_size=config.vocab,
        hidden_size=config.hidden,
        intermediate_size=4 * config.hidden,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.heads,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(model_config).eval()


def tokenize(text: str, vocab: int) -> list[int]:
    """Whitespace words hashed into the vocabulary (deterministic; at least one token)."""
    return [zlib.crc32(word.encode()) % vocab for word in text.split()] or [0]


def prompt_text(payload: dict, chat: bool) -> str:
    if chat:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ServingError("`messages` must be a non-empty list of {role, content}")
        return " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    prompt = payload.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    if not isinstance(prompt, str):
        raise ServingError("`prompt` must be a string")
    return prompt


def max_tokens_of(payload: dict) -> int:
    value = payload.get("max_tokens", payload.get("max_completion_tokens", 16))
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS_LIMIT:
        raise ServingError(f"`max_tokens` must be an integer in [1, {MAX_TOKENS_LIMIT}] (got {value!r})")
    return value


class TinyEngine:
    """The worker's model; `generate` is greedy batch-1 generation with a KV cache (the reference the
    batching engine's tokens are checked against)."""

    def __init__(self, config: WorkerModelConfig, threads: int | None = None):
        import torch

        keep_freed_memory()  # steps of any batch size then cost the same whenever they run (host_memory)
        self.torch = torch
        self.config = config
        self.threads = threads
        self.model = build_worker_model(config)

    def generate(self, prompt_ids: list[int], max_tokens: int, on_token=None) -> list[int]:
        torch = self.torch
        if self.threads:
            torch.set_num_threads(self.threads)
        out: list[int] = []
        with torch.inference_mode():
            result = self.model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
            past = result.cache
            token = int(result.logits[0, -1].argmax())
            for i in range(max_tokens):
                out.append(token)
                if on_token is not None:
                    on_token(token)
                if i + 1 == max_tokens:
                    break
                result = self.model(input_ids=torch.tensor([[token]]), cache=past, use_cache=True)
                past = result.cache
                token = int(result.logits[0, -1].argmax())
        return out


class Worker:
    """The HTTP front of a `TinyEngine`: requests join its continuous-batching engine thread."""

    def __init__(self, engine: TinyEngine, name: str = "tiny", max_num_seqs: int = 16, warm_up_context: int = 0):
        self.engine, self.name = engine, name
        self.batching = BatchingEngine(
            engine.model, engine.torch, max_num_seqs=max_num_seqs, threads=engine.threads,
            warm_up_context=warm_up_context,
        )  # fmt: skip
        if warm_up_context:
            self.batching.start()  # warm up now; /health answers 503 until it is done
        self.served = 0
        self.tokens = 0  # output tokens sent to clients

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = await read_request(reader, timeout=30.0)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return
            if request.method == "GET" and request.path == "/health" and not self.batching.ready.is_set():
                await write_json(writer, 503, {"status": "warming_up", "model": self.name})
            elif request.method == "GET" and request.path == "/health":
                await write_json(
                    writer,
                    200,
                    {
                        "status": "ok",
                        "model": self.name,
                        "served": self.served,
                        "running": self.batching.running,
                        "waiting": len(self.batching.waiting),
                        "max_num_seqs": self.batching.max_num_seqs,
                        "steps": dict(self.batching.steps),
                        # CPU accounting: the engine thread's steps (CPU and wall) and the whole process
                        # (the engine plus HTTP and streaming), so a bench can price the overhead per token
                        "engine_cpu_s": self.batching.cpu_s,
                        "engine_busy_s": self.batching.busy_s,
                        "process_cpu_s": time.process_time(),
                        # pages the process faulted in (freshly mapped memory): ~0 in steady state once the
                        # engine's heap is grown (host_memory), large while it grows or if memory is given back
                        "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
                        "warm_up_faults": self.batching.warm_up_faults,
                        "tokens": self.tokens,
                    },
                )
            elif request.method == "GET" and request.path == "/trex/timeline":
                # every step and finished request the engine remembers (perf_counter seconds: CLOCK_MONOTONIC,
                # comparable with a bench's clock on the same host), for comparing with the simulator's timeline
                await write_json(
                    writer,
                    200,
                    {
                        "now_s": time.perf_counter(),
                        "steps": list(self.batching.step_log),
                        "step_fields": ["kind", "start_s", "end_s", "cpu_s", "seqs", "context", "padded", "repacked"],
                        "requests": list(self.batching.timeline),
                        "request_fields": [
                            "tag",
                            "prompt_tokens",
                            "max_tokens",
                            "submitted_s",
                            "prefill_start_s",
                            "first_token_s",
                            "last_token_s",
                        ],
                    },
                )
            elif request.method == "GET" and request.path == "/v1/models":
                await write_json(writer, 200, {"object": "list", "data": [{"id": self.name, "object": "model"}]})
            elif request.method == "POST" and request.path in ("/v1/completions", "/v1/chat/completions"):
                await self._complete(request, writer, chat=request.path.endswith("chat/completions"))
            else:
                await write_json(
                    writer, 404, error_payload(f"no route {request.method} {request.path}", "not_found", 404)
                )
        except ServingError as error:
            await write_json(writer, 400, error_payload(str(error), "invalid_request_error", 400))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _complete(self, request, writer: asyncio.StreamWriter, chat: bool) -> None:
        payload = request.json()
        if not isinstance(payload, dict):
            raise ServingError("the body must be a JSON object")
        prompt_ids = tokenize(prompt_text(payload, chat), self.engine.config.vocab)
        max_tokens = max_tokens_of(payload)
        stream = bool(payload.get("stream", False))
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()

        def on_token(token: int) -> None:
            loop.call_soon_threadsafe(tokens.put_nowait, token)

        job: asyncio.Future = loop.create_future()

        def on_done(result) -> None:
            def settle() -> None:
                if job.done():
                    return
                if isinstance(result, BaseException):
                    job.set_exception(result)
                    tokens.put_nowait(result)
                else:
                    job.set_result(result)

            loop.call_soon_threadsafe(settle)

        request = BatchedRequest(
            prompt_ids, max_tokens, on_token if stream else None, on_done, tag=str(payload.get("user", ""))
        )
        self.batching.submit(request)
        try:
            await self._respond(writer, chat, stream, prompt_ids, max_tokens, tokens, job)
        finally:
            if not job.done():  # the client went away (or the router gave up): free the batch slot
                request.cancelled = True
                job.cancel()

    async def _respond(self, writer, chat: bool, stream: bool, prompt_ids, max_tokens: int, tokens, job) -> None:
        ident, created = f"cmpl-{uuid.uuid4().hex[:12]}", int(time.time())
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": max_tokens,
            "total_tokens": len(prompt_ids) + max_tokens,
        }
        kind = "chat.completion" if chat else "text_completion"
        if not stream:
            try:
                out = await job
            except Exception as error:  # the engine failed: a 500 the router retries elsewhere, never silence
                await write_json(writer, 500, error_payload(f"the engine failed: {error}", "server_error", 500))
                return
            self.served += 1
            self.tokens += len(out)
            text = " ".join(f"t{t}" for t in out)
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": text, "finish_reason": "length"}
            )
            await write_json(
                writer,
                200,
                {
                    "id": ident,
                    "object": kind,
                    "created": created,
                    "model": self.name,
                    "choices": [choice],
                    "usage": usage,
                },
            )
            return
        first = await tokens.get()
        if isinstance(first, BaseException):  # failed before any token: a 500 the router can retry elsewhere
            await write_json(writer, 500, error_payload(f"the engine failed: {first}", "server_error", 500))
            return
        writer.write(response_head(200, "text/event-stream", extra={"Cache-Control": "no-cache"}))
        for i in range(max_tokens):
            token = first if i == 0 else await tokens.get()
            if isinstance(token, BaseException):  # the engine failed mid-stream: an error event, no [DONE]
                event = error_payload(f"the engine failed: {token}", "server_error", 500)
                writer.write(f"data: {json.dumps(event)}\n\n".encode())
                await writer.drain()
                return
            piece = f" t{token}" if i else f"t{token}"
            delta = (
                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                if chat
                else {"index": 0, "text": piece, "finish_reason": None}
            )
            chunk = {
                "id": ident,
                "object": f"{kind}.chunk" if chat else kind,
                "created": created,
                "model": self.name,
                "choices": [delta],
            }
            writer.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await writer.drain()
        await job
        self.served += 1
        self.tokens += max_tokens
        last = (
            {"index": 0, "delta": {}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": "", "finish_reason": "length"}
        )
        final = {
            "id": ident,
            "object": f"{kind}.chunk" if chat else kind,
            "created": created,
            "model": self.name,
            "choices": [last],
            "usage": usage,
        }
        writer.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        await writer.drain()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
        if host not in LOOPBACK:
            raise ServingError(f"workers listen on loopback only (got host {host!r}); use 127.0.0.1")
        return await asyncio.start_server(self.handle, host, port)

    def close(self) -> None:
        self.batching.stop()
