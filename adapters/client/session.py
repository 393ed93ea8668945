"""Session: one application session over one WebSocket.

Declaring (``function``/``call``/``variable``/``join``/``repr_list``) sends nothing: it appends
to the pending fragment, from any thread. Asking (``aget_many``, a variable's
``aget``/``astream``/``aset``, ``flush``) takes the whole pending fragment and ships it with the
gets in ONE ``submit`` frame, then waits for the answers the receiver task routes back.

All I/O runs on the loop the session was opened on; the public async methods may be awaited
from any loop and the blocking ones called from any other thread (see bridge.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Iterator

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from eclectus.adapters.client.abandon import Abandonment
from eclectus.adapters.client.bridge import LoopBridge
from eclectus.adapters.client.declarations import Declarations
from eclectus.adapters.client.errors import ConnectionError, ConnectionLost, VariableFailed
from eclectus.adapters.client.outbox import Outbox, lost_connection
from eclectus.adapters.client.router import Router, StreamEnd
from eclectus.adapters.client.variables import SemanticVariable, VarState
from eclectus.adapters.client.wire import decode_frame, encode_frame
from eclectus.protocol import (
    Cancel,
    Close,
    Criteria,
    GetSpec,
    Limits,
    ModelCard,
    Set,
    Tokenize,
    Tokens,
    Welcome,
)

log = logging.getLogger(__name__)


class Session(Declarations):
    """A connected application session. Build one with :func:`connect` or
    :func:`~eclectus.adapters.client.sync.connect_sync`, not directly."""

    def __init__(self, ws: ClientConnection, welcome: Welcome, url: str) -> None:
        super().__init__()
        loop = asyncio.get_running_loop()
        self.bridge = LoopBridge(loop, threading.get_ident())
        self._ws = ws
        self._welcome = welcome
        self._url = url
        self._router = Router(self._lookup)
        self._outbox = Outbox(ws, url, self._router, self._pending, self, welcome.limits)
        self._abandonment = Abandonment(
            self._wiring, self._router, self._outbox, self._lookup, self.new_id
        )
        self._closing = False
        self._receiver = loop.create_task(self._receive())

    # -- what the server said at the handshake -------------------------------------------

    @property
    def session_id(self) -> str:
        return self._welcome.session

    @property
    def models(self) -> list[ModelCard]:
        """The models the server serves (from ``welcome``)."""
        return list(self._welcome.models)

    @property
    def limits(self) -> Limits:
        return self._welcome.limits

    @property
    def server_version(self) -> str:
        return self._welcome.server_version

    @property
    def url(self) -> str:
        return self._url

    @property
    def num_frames_sent(self) -> int:
        """Frames this session has sent after ``hello`` (the frame economy, client side)."""
        return self._outbox.num_frames_sent

    @property
    def closed(self) -> bool:
        """True once the session was closed or lost its connection."""
        return self._router.closed is not None

    # -- asking: public entry points, callable from any loop / thread ---------------------

    async def flush(self) -> None:
        """Ships everything pending (no gets) and waits for the server to accept it; raises
        ServerError if it rejects the fragment. Lets the server start nothing yet (work
        starts when something downstream is got) but validates the graph early."""
        await self.bridge.run(self._flush_here)

    async def aget_many(
        self,
        vars: Iterable[SemanticVariable],
        criteria: Criteria = "latency",
        *,
        deadline_ms: float | None = None,
    ) -> list[str]:
        """The texts of ``vars`` in order; pending declarations and all gets go in one frame.
        Raises the first failure (VariableFailed, ConnectionError)."""
        targets = list(vars)
        return await self.bridge.run(lambda: self._get_here(targets, criteria, deadline_ms))

    async def aget_settled(
        self,
        vars: Iterable[SemanticVariable],
        criteria: Criteria = "latency",
        *,
        deadline_ms: float | None = None,
    ) -> list[str | BaseException]:
        """As :meth:`aget_many` (one frame), but waits for every variable and returns each
        one's text or its failure (VariableFailed) instead of raising the first: the
        branches of a switch, where all but one answer ``skipped``. A lost connection
        still raises."""
        targets = list(vars)
        return await self.bridge.run(lambda: self._settle_here(targets, criteria, deadline_ms))

    def get_many(
        self,
        vars: Iterable[SemanticVariable],
        criteria: Criteria = "latency",
        *,
        deadline_ms: float | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Blocking twin of :meth:`aget_many` (not from the session's loop thread)."""
        targets = list(vars)
        return self.bridge.block(lambda: self._get_here(targets, criteria, deadline_ms), timeout)

    def astream(
        self,
        var: SemanticVariable,
        criteria: Criteria = "latency",
        *,
        deadline_ms: float | None = None,
    ) -> AsyncIterator[str]:
        """Deltas of ``var``'s text from any loop; they concatenate to the final value. The
        get carries ``criteria`` and ``deadline_ms`` as :meth:`aget_many`'s do."""
        return self.bridge.aiter(self._stream_here(var, criteria, deadline_ms))

    def stream(
        self,
        var: SemanticVariable,
        criteria: Criteria = "latency",
        *,
        deadline_ms: float | None = None,
        timeout: float | None = None,
    ) -> Iterator[str]:
        """Blocking twin of :meth:`astream`; ``timeout`` bounds the wait for each delta."""
        return self.bridge.iter_blocking(self._stream_here(var, criteria, deadline_ms), timeout)

    async def aset(self, var: SemanticVariable, text: str) -> None:
        """Sends ``set`` for a client-supplied variable after flushing; see
        SemanticVariable.aset. Mutates ``var`` (READY once acknowledged)."""
        await self.bridge.run(lambda: self._set_here(var, text))

    def set(self, var: SemanticVariable, text: str, *, timeout: float | None = None) -> None:
        """Blocking twin of :meth:`aset`."""
        self.bridge.block(lambda: self._set_here(var, text), timeout)

    async def acancel(self, var: SemanticVariable) -> None:
        """Cancels ``var``'s producer on the server (a ``cancel`` frame, after flushing): it
        and everything downstream fail with ``cancelled``, so waiting gets raise
        VariableFailed. Mutates the server's graph; returns once the server acknowledged."""
        await self.bridge.run(lambda: self._cancel_here(var))

    def cancel(self, var: SemanticVariable, *, timeout: float | None = None) -> None:
        """Blocking twin of :meth:`acancel`."""
        self.bridge.block(lambda: self._cancel_here(var), timeout)

    async def tokenize(self, text: str, *, model: str | None = None) -> list[int]:
        """The token ids the server's tokenizer makes of ``text`` (a ``tokenize`` frame)."""
        return await self.bridge.run(lambda: self._tokenize_here(text, model))

    async def count_tokens(self, text: str, *, model: str | None = None) -> int:
        """How many tokens the server's tokenizer makes of ``text``."""
        return len(await self.tokenize(text, model=model))

    async def aclose(self) -> None:
        """Says ``close``, closes the socket and fails whatever still waits with
        ConnectionError("session closed"). Idempotent."""
        await self.bridge.run(self._close_here)

    async def wait_closed(self) -> None:
        """Returns once the session is closed or has lost its connection (waits only)."""
        await self.bridge.run(self._wait_closed_here)

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- the work, on the session's loop ------------------------------------------------

    async def _get_here(
        self, vars: list[SemanticVariable], criteria: Criteria, deadline_ms: float | None
    ) -> list[str]:
        results = await self._ask(vars, criteria, deadline_ms, raise_failed=True)
        # shield: one caller giving up must not cancel a waiter other callers share
        return [r if isinstance(r, str) else await asyncio.shield(r) for r in results]  # type: ignore[arg-type]

    async def _settle_here(
        self, vars: list[SemanticVariable], criteria: Criteria, deadline_ms: float | None
    ) -> list[str | BaseException]:
        settled: list[str | BaseException] = []
        for result in await self._ask(vars, criteria, deadline_ms, raise_failed=False):
            if not isinstance(result, asyncio.Future):
                settled.append(result)
                continue
            try:
                settled.append(await asyncio.shield(result))
            except VariableFailed as exc:
                settled.append(exc)
        return settled

    async def _ask(
        self,
        vars: list[SemanticVariable],
        criteria: Criteria,
        deadline_ms: float | None,
        *,
        raise_failed: bool,
    ) -> list[str | BaseException | asyncio.Future[str]]:
        """Each variable's value, failure or waiter, after shipping one ``get`` per variable
        nobody has asked for yet (mutates the router's waiters). ``raise_failed``: a variable
        already failed raises its error before anything ships."""
        self._router.raise_if_closed()
        results: list[str | BaseException | asyncio.Future[str]] = []
        gets: list[GetSpec] = []
        for var in vars:
            self.check_owned(var)
            if var.state is VarState.READY:
                results.append(var.value or "")
            elif var.state is VarState.FAILED:
                assert var.error is not None
                if raise_failed:
                    raise var.error
                results.append(var.error)
            else:
                waiter, is_new = self._router.waiter(var.id, (criteria, deadline_ms))
                if is_new:
                    gets.append(GetSpec(var=var.id, criteria=criteria, deadline_ms=deadline_ms))
                results.append(waiter)
        if gets:
            await self._outbox.ship(gets)
        return results

    async def _stream_here(
        self, var: SemanticVariable, criteria: Criteria, deadline_ms: float | None
    ) -> AsyncIterator[str]:
        self._router.raise_if_closed()
        self.check_owned(var)
        if var.state is VarState.FAILED:
            assert var.error is not None
            raise var.error
        if var.state is VarState.READY:
            yield var.value or ""
            return
        queue, is_new = self._router.open_stream(var.id)
        shipped, ended = not is_new, False
        try:
            if is_new:
                get = GetSpec(var=var.id, criteria=criteria, deadline_ms=deadline_ms, stream=True)
                await self._outbox.ship([get])
                shipped = True
            received: list[str] = []
            while True:
                item = await queue.get()
                ended = isinstance(item, BaseException | StreamEnd)
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, StreamEnd):
                    # deltas sent before our get (or lost) are made up from the final text
                    so_far = "".join(received)
                    if item.text.startswith(so_far) and len(item.text) > len(so_far):
                        yield item.text[len(so_far) :]
                    return
                received.append(item)
                yield item
        finally:
            self._router.close_stream(var.id, queue)
            if not shipped:  # cancelled before its get left: consumers that joined must not hang
                self._router.abandon_stream(var.id)
            elif not ended:  # closed early (break, aclose, close) or its task cancelled
                self._abandonment.on_abandoned(var)

    async def _set_here(self, var: SemanticVariable, text: str) -> None:
        self.check_owned(var)
        await self._outbox.ship([])  # the variable must be declared before it is set
        frame_id = self.new_id("set")
        reply = self._router.expect_reply(frame_id)
        await self._outbox.send(Set(id=frame_id, var=var.id, value=text))
        await reply
        var._resolve(text)

    async def _cancel_here(self, var: SemanticVariable) -> None:
        self.check_owned(var)
        await self._outbox.ship([])  # the variable must exist on the server to be cancelled
        frame_id = self.new_id("k")
        reply = self._router.expect_reply(frame_id)
        await self._outbox.send(Cancel(id=frame_id, var=var.id))
        await reply

    async def _tokenize_here(self, text: str, model: str | None) -> list[int]:
        frame_id = self.new_id("t")
        reply = self._router.expect_reply(frame_id)
        await self._outbox.send(Tokenize(id=frame_id, text=text, model=model))
        frame = await reply
        assert isinstance(frame, Tokens), frame
        return frame.ids

    async def _flush_here(self) -> None:
        for reply in await self._outbox.ship([], expect_ack=True):
            await reply

    async def _wait_closed_here(self) -> None:
        await asyncio.shield(self._receiver)  # a waiter giving up must not stop the receiver

    def _closed_reason(self) -> BaseException | None:
        return self._router.closed

    async def _receive(self) -> None:
        """The receiver task: routes every server frame until the socket ends, then fails
        whatever still waits: ConnectionLost when the server or the network ended it,
        ConnectionError("session closed") when this client closed it."""
        error: ConnectionError
        try:
            async for raw in self._ws:
                try:
                    frame = decode_frame(raw)
                except ValidationError as exc:
                    log.warning("ignoring a frame this client does not understand: %s", exc)
                    continue
                self._router.dispatch(frame)
            code, reason = self._ws.close_code, self._ws.close_reason or ""
            error = ConnectionLost(self._url, code, reason)
        except ConnectionClosed as exc:
            error = lost_connection(self._url, exc)
        except Exception as exc:  # a routing bug must not leave callers hanging
            log.exception("session receiver failed")
            error = ConnectionError(f"session receiver failed: {exc!r}")
        self._router.fail_all(ConnectionError("session closed") if self._closing else error)

    async def _close_here(self) -> None:
        if self._closing:
            await asyncio.shield(self._receiver)
            return
        self._closing = True
        if self._router.closed is None:
            with contextlib.suppress(ConnectionClosed):
                await self._ws.send(encode_frame(Close(id=self.new_id("x"))))
        await self._ws.close()
        await asyncio.shield(self._receiver)
        self._router.fail_all(ConnectionError("session closed"))
