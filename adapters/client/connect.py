"""Opening a session: the WebSocket, then ``hello`` -> ``welcome`` (or ``error``).

The hello travels in the upgrade request (``Eclectus-Hello``), so the welcome comes right
after the upgrade: one round trip for the whole setup. A server that does not say it took
the header gets the hello as the first frame (docs/protocol.md, "Session").

A server at its session caps (total, or its tenant's) refuses a new session with
``limit_exceeded`` at hello, and one at its connection cap answers the upgrade with HTTP 429;
both are retryable (docs/protocol.md, "Session"): the session is retried with exponential
backoff and full jitter (``retries`` times, at most ``MAX_BACKOFF_S`` apart), then the last
refusal is raised as :class:`SessionRefused`.

``connect(url)`` may be awaited (``app = await connect(url)``) or used as an async context
manager (``async with connect(url) as app``), like ``websockets.connect``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Generator
from typing import Any

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from eclectus.adapters.client.errors import (
    AuthError,
    ConnectionError,
    ServerError,
    SessionRefused,
)
from eclectus.adapters.client.meter import count_frame
from eclectus.adapters.client.session import Session
from eclectus.adapters.client.wire import decode_frame, encode_frame
from eclectus.protocol import HELLO_ACCEPTED, HELLO_HEADER, Error, Hello, Welcome

DEFAULT_URL = "ws://127.0.0.1:8765"  # `eclectus serve` with its default host and port
DEFAULT_TIMEOUT = 10.0  # seconds for the socket to open and the welcome to arrive
MAX_SERVER_FRAME_BYTES = 64 * 2**20  # a long value or a large tokens reply fits
TOKEN_ENV = "ECLECTUS_TOKEN"
MAX_HELLO_HEADER_CHARS = 4096
DEFAULT_RETRIES = 8  # a refused session is tried this many more times
FIRST_BACKOFF_S = 0.05  # the first retry's ceiling; it doubles per retry
MAX_BACKOFF_S = 2.0
log = logging.getLogger(__name__)


class _Refused(Exception):
    """The server is at a cap right now: worth trying again later."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


async def open_session(
    url: str,
    *,
    token: str | None = None,
    app: str | None = None,
    tenant: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = DEFAULT_RETRIES,
) -> Session:
    """Connects and runs the handshake on the running loop, retrying a session the server
    refused for load (mutates nothing but the network). ``token`` defaults to
    ``$ECLECTUS_TOKEN``. Raises AuthError (refused), SessionRefused (still at a cap after
    ``retries`` retries), ServerError (other error reply) or ConnectionError (unreachable,
    closed, or no welcome within ``timeout``)."""
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    hello = Hello(id="hello", token=token, app=app, tenant=tenant)
    for attempt in range(retries + 1):
        try:
            return await _open(url, hello, timeout)
        except _Refused as refused:
            if attempt == retries:
                raise SessionRefused(refused.message, retries) from None
            delay = random.uniform(0, min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2**attempt))
            log.info("%s refused a session (%s); retrying in %.2f s", url, refused, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def _open(url: str, hello: Hello, timeout: float) -> Session:
    """One try: the upgrade (hello in its header) and the welcome. _Refused when the
    server is at a cap."""
    header = encode_frame(hello, ascii_only=True)
    # HTTP servers cap a request head (h11: 16 KiB): a hello that long goes as a frame
    headers = {HELLO_HEADER: header} if len(header) <= MAX_HELLO_HEADER_CHARS else {}
    try:
        ws = await ws_connect(
            url,
            additional_headers=headers,
            open_timeout=timeout,
            max_size=MAX_SERVER_FRAME_BYTES,
            ping_timeout=60,
        )
    except InvalidStatus as exc:
        if exc.response.status_code == 429:  # at its connection cap
            raise _Refused(f"HTTP 429 from {url}") from None
        raise ConnectionError(f"cannot connect to {url}: {exc}") from exc
    except (OSError, TimeoutError, WebSocketException) as exc:
        raise ConnectionError(f"cannot connect to {url}: {exc}") from exc
    try:
        response = ws.response
        taken = response is not None and response.headers.get(HELLO_HEADER) == HELLO_ACCEPTED
        welcome = await asyncio.wait_for(_handshake(ws, None if taken else hello, url), timeout)
    except TimeoutError as exc:
        await ws.close()
        raise ConnectionError(f"no welcome from {url} within {timeout} s") from exc
    except BaseException:
        await ws.close()
        raise
    return Session(ws, welcome, url)


async def _handshake(ws: ClientConnection, hello: Hello | None, url: str) -> Welcome:
    """The welcome, after sending ``hello`` as a frame (None: the server took it from the
    upgrade request)."""
    try:
        if hello is not None:
            await ws.send(encode_frame(hello))
            count_frame()
        raw = await ws.recv()
    except ConnectionClosed as exc:
        raise ConnectionError(f"{url} closed the connection during the handshake: {exc}") from exc
    try:
        frame = decode_frame(raw)
    except ValidationError as exc:
        raise ConnectionError(f"{url} answered hello with an unreadable frame: {exc}") from exc
    if isinstance(frame, Welcome):
        return frame
    if isinstance(frame, Error) and frame.code == "unauthorized":
        raise AuthError(frame.message, frame.code)
    if isinstance(frame, Error) and frame.code == "limit_exceeded":  # at a session cap
        raise _Refused(frame.message)
    if isinstance(frame, Error):
        raise ServerError.from_frame(frame)
    raise ConnectionError(f"{url} answered hello with {frame.type!r}, not 'welcome'")


class Connecting:
    """The awaitable / async context manager :func:`connect` returns (holds the session
    once entered)."""

    def __init__(self, url: str, **options: Any) -> None:
        self._url = url
        self._options = options
        self._session: Session | None = None

    def __await__(self) -> Generator[Any, None, Session]:
        return open_session(self._url, **self._options).__await__()

    async def __aenter__(self) -> Session:
        self._session = await open_session(self._url, **self._options)
        return self._session

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.aclose()


def connect(
    url: str,
    *,
    token: str | None = None,
    app: str | None = None,
    tenant: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = DEFAULT_RETRIES,
) -> Connecting:
    """Opens an application session on the running loop: ``async with connect(url) as app``
    or ``app = await connect(url)`` (then ``await app.aclose()``). ``app`` names the
    application (the server's app-FIFO and metrics key), ``tenant`` its tenant;
    ``retries``: how many more times a session the server refused for load is tried."""
    return Connecting(url, token=token, app=app, tenant=tenant, timeout=timeout, retries=retries)
