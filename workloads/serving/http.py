"""The small HTTP/1.1 layer the worker and the router share, on asyncio streams (standard library only).

One request per connection (`Connection: close`): a response either carries `Content-Length` or,
for server-sent events, runs until the server closes. Every read has a deadline, so a peer that
stops talking raises `TimeoutError` instead of holding a task forever.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from trex.workloads.serving.errors import ServingError

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        try:
            return json.loads(self.body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ServingError(f"request body is not valid JSON ({error})") from None


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


async def read_request(reader: asyncio.StreamReader, timeout: float) -> HttpRequest:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    if len(head) > MAX_HEADER_BYTES:
        raise ServingError("request headers too large")
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, path, _ = lines[0].split(" ", 2)
    except ValueError:
        raise ServingError(f"malformed request line {lines[0]!r}") from None
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY_BYTES:
        raise ServingError(f"request body of {length} bytes exceeds {MAX_BODY_BYTES}")
    body = await asyncio.wait_for(reader.readexactly(length), timeout) if length else b""
    return HttpRequest(method.upper(), path, headers, body)


def response_head(
    status: int, content_type: str, length: int | None = None, extra: dict[str, str] | None = None
) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}", f"Content-Type: {content_type}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines.extend(f"{k}: {v}" for k, v in (extra or {}).items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def write_json(writer: asyncio.StreamWriter, status: int, payload, extra: dict[str, str] | None = None) -> None:
    body = json.dumps(payload).encode()
    writer.write(response_head(status, "application/json", len(body), extra) + body)
    await writer.drain()


def error_payload(message: str, kind: str, code: int) -> dict:
    """The OpenAI error shape: {"error": {"message", "type", "code"}}."""
    return {"error": {"message": message, "type": kind, "code": code}}


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @staticmethod
    def parse(url: str) -> Endpoint:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ServingError(f"worker URL {url!r} must look like http://HOST:PORT")
        return Endpoint(parts.hostname, parts.port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class UpstreamResponse:
    """A response being read from a worker: status and headers now, the body as it arrives."""

    def __init__(
        self, status: int, headers: dict[str, str], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ):
        self.status, self.headers, self.reader, self.writer = status, headers, reader, writer

    async def read_body(self, timeout: float) -> bytes:
        length = self.headers.get("content-length")
        if length is not None:
            return await asyncio.wait_for(self.reader.readexactly(int(length)), timeout)
        return await asyncio.wait_for(self.reader.read(MAX_BODY_BYTES), timeout)

    async def lines(self, timeout: float):
        """Lines of a streamed body; each must arrive within `timeout` seconds of the previous one."""
        while True:
            line = await asyncio.wait_for(self.reader.readline(), timeout)
            if not line:
                return
            yield line

    def close(self) -> None:
        self.writer.close()


async def open_request(
    endpoint: Endpoint, method: str, path: str, payload=None, timeout: float = 10.0
) -> UpstreamResponse:
    """Send a request and read the status line and headers (each step bounded by `timeout`)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(endpoint.host, endpoint.port), timeout)
    body = json.dumps(payload).encode() if payload is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {endpoint.host}:{endpoint.port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1")
    writer.write(head + body)
    try:
        await asyncio.wait_for(writer.drain(), timeout)
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except BaseException:
        writer.close()
        raise
    lines = raw.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        writer.close()
        raise ServingError(f"{endpoint.url} answered with a malformed status line {lines[0][:80]!r}") from None
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    return UpstreamResponse(status, headers, reader, writer)


async def request_json(
    endpoint: Endpoint, method: str, path: str, payload=None, timeout: float = 10.0
) -> tuple[int, object]:
    """A whole request/response; raises ServingError when the body is not JSON."""
    response = await open_request(endpoint, method, path, payload, timeout)
    try:
        body = await response.read_body(timeout)
    finally:
        response.close()
    try:
        return response.status, json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ServingError(f"{endpoint.url}{path} returned a body that is not JSON: {body[:80]!r}") from None
