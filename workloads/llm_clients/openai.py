"""OpenAI-compatible HTTP client: what vLLM, vllm-ascend, SGLang and hosted APIs serve.

`POST {base}/v1/chat/completions` (default) or `POST {base}/v1/completions`, one request per
sample, up to `concurrency` in flight. Connection failures, timeouts, HTTP 408/409/429 and 5xx
are retried with exponential backoff and jitter (honouring `Retry-After`), up to `max_retries`
times; other HTTP errors fail at once. Before the first request, `GET {base}/v1/models` checks
that the server answers at all, so a wrong URL fails in seconds, naming the URL and the error.
Only the standard library is used.
"""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from trex.workloads.llm_clients.base import Completion, GenerationRequest
from trex.workloads.llm_clients.errors import ClientError

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
APIS = ("chat", "completions")


def api_root(base_url: str) -> str:
    """`http://host:8000`, `http://host:8000/` and `http://host:8000/v1` all mean `.../v1`."""
    root = base_url.rstrip("/")
    if not root.startswith(("http://", "https://")):
        raise ClientError(f"base URL {base_url!r} must start with http:// or https://")
    return root if root.endswith("/v1") else root + "/v1"


class OpenAIClient:
    persist_generations = True

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api: str = "chat",
        api_key: str | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_tokens: int = 4096,
        timeout_s: float = 600.0,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        backoff_max_s: float = 60.0,
        concurrency: int = 8,
        system_prompt: str | None = None,
        seed: int | None = None,
        preflight: bool = True,
    ):
        if api not in APIS:
            raise ClientError(f"unknown api {api!r}; valid: {', '.join(APIS)}")
        if concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ClientError(
                f"need concurrency >= 1, max_retries >= 0, timeout > 0 (got {concurrency}, {max_retries}, {timeout_s})"
            )
        self.root = api_root(base_url)
        self.model, self.api, self.api_key = model, api, api_key
        self.temperature, self.top_p, self.max_tokens, self.seed = temperature, top_p, max_tokens, seed
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.concurrency = concurrency
        self.system_prompt = system_prompt
        self.retries = 0  # total retries performed, for reports and tests
        self._retries_lock = threading.Lock()
        self._preflight_done = not preflight
        self._stop = threading.Event()  # set when generation is abandoned: stop retrying

    @property
    def endpoint(self) -> str:
        return f"{self.root}/{'chat/completions' if self.api == 'chat' else 'completions'}"

    def identity(self) -> dict:
        return {
            "client": "openai",
            "base_url": self.root,
            "model": self.model,
            "api": self.api,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "system_prompt": self.system_prompt,
        }

    # -- HTTP ----------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def preflight(self) -> None:
        """Fail fast when nothing answers at the base URL (any HTTP answer, even 404, is fine)."""
        url = f"{self.root}/models"
        request = urllib.request.Request(url, headers=self._headers(), method="GET")
        try:
            with urllib.request.urlopen(request, timeout=min(self.timeout_s, 10.0)) as response:
                response.read()
        except urllib.error.HTTPError:
            pass
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ClientError(f"cannot reach the model server at {url}: {reason}") from None
        self._preflight_done = True

    def _payload(self, prompt: str, seed_offset: int) -> dict:
        payload: dict = {
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "n": 1,
        }
        if self.seed is not None:
            payload["seed"] = self.seed + seed_offset
        if self.api == "chat":
            messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            payload["messages"] = [*messages, {"role": "user", "content": prompt}]
        else:
            payload["prompt"] = prompt
        return payload

    def complete(self, prompt: str, seed_offset: int = 0) -> str:
        """One completion, with retries; raises ClientError naming the URL when it gives up."""
        body = json.dumps(self._payload(prompt, seed_offset)).encode()
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if self._stop.is_set():
                raise ClientError(f"{self.endpoint}: abandoned after another request failed")
            if attempt:
                with self._retries_lock:
                    self.retries += 1
            request = urllib.request.Request(self.endpoint, data=body, headers=self._headers(), method="POST")
            retry_after = None
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return self._parse(response.read())
            except urllib.error.HTTPError as error:
                detail = error.read()[:500].decode(errors="replace")
                last_error = f"HTTP {error.code}: {detail}"
                if error.code not in RETRYABLE_STATUS:
                    raise ClientError(f"{self.endpoint} refused the request: {last_error}") from None
                retry_after = _retry_after(error.headers.get("Retry-After"))
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as error:
                last_error = str(getattr(error, "reason", error)) or type(error).__name__
            if attempt < self.max_retries:
                self._stop.wait(retry_after if retry_after is not None else self._backoff(attempt))
        raise ClientError(f"{self.endpoint} failed after {self.max_retries + 1} attempts: {last_error}")

    def _backoff(self, attempt: int) -> float:
        return min(self.backoff_max_s, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)

    def _parse(self, raw: bytes) -> str:
        try:
            data = json.loads(raw)
            choice = data["choices"][0]
            text = choice["message"]["content"] if self.api == "chat" else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise ClientError(
                f"{self.endpoint} answered something that is not a completion ({error!r}): {raw[:300]!r}"
            ) from None
        return text if isinstance(text, str) else ""

    # -- Client --------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> Iterator[Completion]:
        if not requests:
            return
        if not self._preflight_done:
            self.preflight()
        self._stop.clear()
        pending: dict[Future, GenerationRequest] = {}
        queue = iter(requests)
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="openai")
        finished = False
        try:
            for request in queue:
                pending[pool.submit(self.complete, request.prompt, request.sample)] = request
                if len(pending) >= self.concurrency:
                    break
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    request = pending.pop(future)
                    yield Completion(key=request.key, text=future.result())
                    following = next(queue, None)
                    if following is not None:
                        pending[pool.submit(self.complete, following.prompt, following.sample)] = following
            finished = True
        finally:
            if not finished:
                self._stop.set()  # in-flight requests give up instead of retrying
            pool.shutdown(wait=finished, cancel_futures=True)

    def close(self) -> None:
        pass


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, min(float(value), 300.0))
    except ValueError:
        return None
