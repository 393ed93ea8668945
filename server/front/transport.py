"""The WebSocket as a session sees it: receive a message, send a text frame, close.

A small seam between the frame loop (session.py) and the ASGI server, so the session does not
depend on one WebSocket implementation and tests can see exactly what it uses.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState


class Disconnected(Exception):
    """The client went away (or the socket is closed)."""


class Transport(Protocol):
    async def recv(self) -> str | bytes:
        """The next message; Disconnected when the connection ends."""
        ...

    async def send(self, text: str) -> None:
        """Send one text frame; Disconnected when the connection is gone."""
        ...

    async def close(self, code: int, reason: str = "") -> None:
        """Close the connection (idempotent; never raises)."""
        ...


class StarletteTransport:
    """A Starlette WebSocket that was accepted."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def recv(self) -> str | bytes:
        try:
            message = await self.ws.receive()
        except (RuntimeError, OSError, WebSocketDisconnect):
            raise Disconnected from None
        if message["type"] == "websocket.disconnect":
            raise Disconnected
        text = message.get("text")
        if text is not None:
            return str(text)
        return bytes(message.get("bytes") or b"")

    async def send(self, text: str) -> None:
        try:
            await self.ws.send_text(text)
        except (RuntimeError, OSError, WebSocketDisconnect):
            raise Disconnected from None

    async def close(self, code: int, reason: str = "") -> None:
        if self.ws.application_state is WebSocketState.DISCONNECTED:
            return
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            await self.ws.close(code, reason)
