"""A protocol peer for the SDK's unit tests: a real local WebSocket server that validates and
records every client frame and answers with canned protocol frames.

It runs no graph and no model: a get is answered with ``texts[var]`` (default
``"text of <var>"``), streamed as 3-character deltas when asked. Tests script failures with
``fail_vars`` (error on that variable's get) and ``reject_submits`` (error on the submit),
generations that never end with ``hold_gets`` (no answer) or ``hold_values`` (deltas,
never the value), and lost connections with ``drop_submits``.
It runs on its own loop thread so that async and blocking tests can share it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel, ValidationError
from websockets.asyncio.server import Server, ServerConnection, serve

from eclectus.protocol import (
    CLIENT_FRAME,
    Ack,
    Delta,
    Error,
    Limits,
    ModelCard,
    Tokens,
    Usage,
    Value,
    Welcome,
)


class FakePeer:
    """Records ``frames`` (client frames as dicts, in arrival order, all connections)."""

    def __init__(
        self,
        token: str | None = None,
        max_frame_bytes: int = 1 << 20,
        max_vars_per_session: int = 10_000,
        max_calls_per_session: int = 4_096,
    ) -> None:
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self.max_vars_per_session = max_vars_per_session
        self.max_calls_per_session = max_calls_per_session
        self.frames: list[dict[str, Any]] = []
        self.invalid: list[str] = []  # frames that failed protocol validation
        self.texts: dict[str, str] = {}
        self.fail_vars: dict[str, str] = {}  # var id -> error code
        self.reject_submits: str | None = None  # error code for every submit
        self.hold_gets = False  # never answer gets (pending-forever tests)
        self.hold_values = False  # streamed gets get their deltas, no get its value
        self.drop_submits = 0  # the next N submits close their connection unanswered (1011)
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._connections: set[ServerConnection] = set()

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        """The recorded client frames of one type (pure)."""
        return [f for f in self.frames if f.get("type") == kind]

    def drop_connections(self) -> None:
        """Closes every client socket abruptly from the server side (code 1011)."""

        async def drop() -> None:
            for ws in list(self._connections):
                await ws.close(1011, "peer dropped the connection")

        asyncio.run_coroutine_threadsafe(drop(), self._loop).result(5)

    async def _handle(self, ws: ServerConnection) -> None:
        self._connections.add(ws)
        try:
            async for raw in ws:
                frame = json.loads(raw)
                self.frames.append(frame)
                try:
                    CLIENT_FRAME.validate_python(frame)
                except ValidationError as exc:
                    self.invalid.append(f"{frame}: {exc}")
                if frame["type"] == "submit" and self.drop_submits > 0:
                    self.drop_submits -= 1
                    await ws.close(1011, "peer dropped the connection")
                    return
                for reply in self._answer(frame):
                    await ws.send(reply.model_dump_json(exclude_none=True))
                if frame["type"] == "close" or self._refused(frame):
                    await ws.close(1008 if self._refused(frame) else 1000)
                    return
        finally:
            self._connections.discard(ws)

    def _refused(self, frame: dict[str, Any]) -> bool:
        return (
            frame["type"] == "hello" and self.token is not None and frame.get("token") != self.token
        )

    def _answer(self, frame: dict[str, Any]) -> list[BaseModel]:
        kind, frame_id = frame["type"], frame.get("id")
        if kind == "hello":
            if self._refused(frame):
                return [
                    Error(id=frame_id, code="unauthorized", message="wrong token", field="token")
                ]
            return [self._welcome(frame_id)]
        if kind == "submit":
            if self.reject_submits:
                return [
                    Error(id=frame_id, code=self.reject_submits, message="rejected", field="calls")
                ]
            replies: list[BaseModel] = [Ack(id=frame_id)]
            if not self.hold_gets:
                for get in frame.get("gets", []):
                    replies.extend(self._get(frame_id, get["var"], get.get("stream", False)))
            return replies
        if kind == "tokenize":
            words = frame["text"].split()
            return [Tokens(id=frame_id, count=len(words), ids=list(range(len(words))))]
        return [Ack(id=frame_id)]  # set, cancel, close

    def _get(self, frame_id: str | None, var: str, stream: bool) -> list[BaseModel]:
        if var in self.fail_vars:
            return [Error(id=frame_id, code=self.fail_vars[var], message="it broke", var=var)]
        text = self.texts.get(var, f"text of {var}")
        deltas = [text[i : i + 3] for i in range(0, len(text), 3)] if stream else []
        usage = Usage(prompt_tokens=5, completion_tokens=len(text))
        value = Value(id=frame_id, var=var, text=text, usage=usage, finish_reason="stop")
        return [
            *(Delta(id=frame_id, var=var, text=d) for d in deltas),
            *([] if self.hold_values else [value]),
        ]

    def _welcome(self, frame_id: str | None) -> Welcome:
        limits = Limits(
            max_frame_bytes=self.max_frame_bytes,
            max_prompt_tokens=4096,
            max_vars_per_session=self.max_vars_per_session,
            max_calls_per_session=self.max_calls_per_session,
            max_pending_gets_per_session=1024,
            max_map_items=1024,
            max_map_element_bytes=65536,
        )
        return Welcome(
            id=frame_id,
            session="peer-session",
            server_version="peer",
            models=[ModelCard(name="tiny", context_window=2048)],
            limits=limits,
        )

    @contextmanager
    def running(self) -> Iterator[FakePeer]:
        """Serves on a free loopback port in a daemon thread until the block ends."""

        async def start() -> Server:
            return await serve(self._handle, "127.0.0.1", 0)

        thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        thread.start()
        server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(5)
        self.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:

            async def stop() -> None:
                server.close()
                await server.wait_closed()

            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(5)
            self._loop.close()
