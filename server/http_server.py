"""A small HTTP/1.1 server for the OpenAI-compatible API.

The WebSocket port cannot take request bodies (websockets' handshake parser refuses them), so
the OpenAI-compatible endpoints listen on their own port. This module only speaks HTTP:
keep-alive, Content-Length request bodies up to a limit, and responses that are either one body
or a stream sent with chunked transfer encoding (server-sent events). Routing and auth live with
the caller's handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str  # without the query string
    headers: dict[str, str]  # lower-cased names
    body: bytes

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


@dataclass(slots=True)
class HttpResponse:
    """``body`` bytes are sent with a Content-Length; an async iterator is streamed chunked."""

    status: int
    body: bytes | AsyncIterator[bytes]
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, payload: object) -> HttpResponse:
        return cls(status, json.dumps(payload).encode() + b"\n")


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpServer:
    """A listening HTTP server and its open connections. ``close`` also ends idle
    keep-alive connections (asyncio.Server.close leaves them to their clients)."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and end every connection (mutates; idempotent)."""
        if self.server is None:
            return
        server, self.server = self.server, None
        server.close()
        for task in self.connections:
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        await server.wait_closed()


async def start_http_server(
    handler: Handler, host: str, port: int, max_body_bytes: int
) -> HttpServer:
    """Listen on (host, port) and serve every connection with ``handler`` (mutates: binds)."""
    http = HttpServer()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        http.connections.add(task)
        try:
            await _serve_connection(handler, reader, writer, max_body_bytes)
        finally:
            http.connections.discard(task)

    http.server = await asyncio.start_server(on_connection, host, port, limit=MAX_HEAD_BYTES)
    return http


async def _serve_connection(
    handler: Handler,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    max_body_bytes: int,
) -> None:
    try:
        while True:
            try:
                request = await _read_request(reader, max_body_bytes)
            except _BadRequest as exc:
                error = {"error": {"message": str(exc), "type": "invalid_request_error"}}
                await _write(writer, HttpResponse.json(exc.status, error), keep_alive=False)
                return
            if request is None:
                return
            try:
                response = await handler(request)
            except Exception:  # a handler bug must not take the server down
                log.exception("HTTP handler failed for %s %s", request.method, request.path)
                error = {"error": {"message": "internal server error", "type": "server_error"}}
                response = HttpResponse.json(500, error)
            await _write(writer, response, request.keep_alive)
            if not request.keep_alive:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # the client went away; nothing to answer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _read_request(reader: asyncio.StreamReader, max_body_bytes: int) -> HttpRequest | None:
    """The next request on the connection, or None at a clean end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "incomplete request head") from None
        return None
    except asyncio.LimitOverrunError:
        raise _BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, _version = lines[0].split(" ", 2)
    except ValueError:
        raise _BadRequest(HTTPStatus.BAD_REQUEST, f"bad request line {lines[0]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise _BadRequest(HTTPStatus.LENGTH_REQUIRED, "chunked request bodies are not supported")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        length = -1
    if length < 0:
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "Content-Length is not a number >= 0")
    if length > max_body_bytes:
        raise _BadRequest(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes > {max_body_bytes}"
        )
    body = await reader.readexactly(length) if length else b""
    return HttpRequest(method.upper(), target.split("?", 1)[0], headers, body)


async def _write(writer: asyncio.StreamWriter, response: HttpResponse, keep_alive: bool) -> None:
    reason = HTTPStatus(response.status).phrase
    head = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}"]
    head += [f"{k}: {v}" for k, v in response.headers.items()]
    head.append(f"Connection: {'keep-alive' if keep_alive else 'close'}")
    if isinstance(response.body, bytes):
        head.append(f"Content-Length: {len(response.body)}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body)
        await writer.drain()
        return
    head += ["Transfer-Encoding: chunked", "Cache-Control: no-cache"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
    stream = response.body
    try:
        async for piece in stream:
            if piece:
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
    finally:
        # a client that leaves mid-stream closes the generator, which aborts the request
        with contextlib.suppress(Exception):
            await stream.aclose()  # type: ignore[attr-defined]
    writer.write(b"0\r\n\r\n")
    await writer.drain()
