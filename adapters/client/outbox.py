"""Everything that leaves the client, in order: submits (split when too large), the
release of dropped variables, and single frames, on the session's loop.

One asyncio lock keeps "take the pending fragment, send it" atomic, so fragments reach the
server in the order they were taken and a later fragment never overtakes the one that
declares its inputs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from eclectus.adapters.client.errors import ConnectionLost
from eclectus.adapters.client.fragment import PendingFragment, created_ids, plan_submits
from eclectus.adapters.client.meter import count_frame
from eclectus.adapters.client.router import Router
from eclectus.adapters.client.wire import encode_frame
from eclectus.protocol import (
    MAX_RELEASE_IDS,
    Cancel,
    Close,
    Error,
    GetSpec,
    Limits,
    Release,
    ServerFrame,
    Set,
    Tokenize,
)

log = logging.getLogger("eclectus.adapters.client.wire")


class IdSource(Protocol):
    """What the outbox needs from the declaring side of a session."""

    def new_id(self, prefix: str) -> str: ...

    def take_released(self, limit: int) -> list[str]: ...


class Outbox:
    """The session's sending side (mutated only on the session's loop)."""

    def __init__(
        self,
        ws: ClientConnection,
        url: str,
        router: Router,
        pending: PendingFragment,
        source: IdSource,
        limits: Limits,
    ) -> None:
        self._ws = ws
        self._url = url
        self._router = router
        self._pending = pending
        self._source = source
        self._limits = limits
        self._lock = asyncio.Lock()
        self.num_frames_sent = 0  # after hello: the frame economy, client side
        # declarations shipped since the last release frame (see _maybe_release)
        self._num_vars_unreleased = 0
        self._num_nodes_unreleased = 0

    async def ship(
        self, gets: list[GetSpec], *, expect_ack: bool = False
    ) -> list[asyncio.Future[ServerFrame]]:
        """Sends the pending fragment plus ``gets``, as one submit unless it exceeds the
        server's max_frame_bytes (mutates: empties the pending fragment). Returns the ack
        futures when asked for them."""
        async with self._lock:
            fragment = self._pending.take()
            if fragment.is_empty and not gets:
                return []
            max_bytes = self._limits.max_frame_bytes
            frames = plan_submits(fragment, gets, max_bytes, lambda: self._source.new_id("s"))
            replies: list[asyncio.Future[ServerFrame]] = []
            refusal: str | None = None
            for frame in frames:
                assert frame.id is not None
                gets_ids = [g.var for g in frame.gets]
                self._router.track_submit(frame.id, created_ids(frame), gets_ids)
                if expect_ack:
                    replies.append(self._router.expect_reply(frame.id))
                text = encode_frame(frame)
                if refusal is None and len(text.encode()) > max_bytes:
                    refusal = f"a submit item of {len(text.encode())} bytes exceeds "
                    refusal += f"max_frame_bytes {max_bytes}"
                if refusal is not None:
                    # fail it (and every later part) exactly as if the server had refused it
                    error = Error(id=frame.id, code="limit_exceeded", message=refusal)
                    self._router.dispatch(error)
                    continue
                await self.send_text(text)
            self._num_vars_unreleased += sum(len(f.vars) for f in frames)
            self._num_nodes_unreleased += sum(len(f.calls) + len(f.ops) for f in frames)
            await self._maybe_release()
            return replies

    async def _maybe_release(self) -> None:
        """Tells the server which variables the client dropped, once what was shipped since
        the last release reaches half a per-session limit (mutates: counters, queue).

        Rare on purpose: a release is a frame of its own, and frames are what the graph
        saves. Half the limit leaves the other half for what the application still holds.
        Sent after the submits of the same shipment: a dropped variable may be an input of
        a call in them, which the server then runs before freeing it.
        """
        limits = self._limits
        if (
            self._num_vars_unreleased < limits.max_vars_per_session // 2
            and self._num_nodes_unreleased < limits.max_calls_per_session // 2
        ):
            return
        self._num_vars_unreleased = self._num_nodes_unreleased = 0
        while ids := self._source.take_released(MAX_RELEASE_IDS):
            await self.send(Release(id=self._source.new_id("r"), vars=ids))

    async def send(self, frame: Set | Cancel | Release | Tokenize | Close) -> None:
        """Sends one frame that carries no declarations (mutates: counts it)."""
        await self.send_text(encode_frame(frame))

    async def send_text(self, text: str) -> None:
        """Sends encoded text; a closed socket fails everything waiting with
        ConnectionLost and raises it (mutates: counts the frame)."""
        self._router.raise_if_closed()
        if log.isEnabledFor(logging.DEBUG):  # the wire, frame by frame, for debugging
            log.debug("sent %s", text)
        try:
            await self._ws.send(text)
            self.num_frames_sent += 1
            count_frame()
        except ConnectionClosed as exc:
            error = lost_connection(self._url, exc)
            self._router.fail_all(error)
            raise error from exc


def lost_connection(url: str, exc: ConnectionClosed) -> ConnectionLost:
    """The SDK's error for a socket that websockets reports closed under a session (pure)."""
    rcvd = exc.rcvd  # the server's close frame; None when none arrived
    return ConnectionLost(url, rcvd.code if rcvd else None, rcvd.reason if rcvd else "")
