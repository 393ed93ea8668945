"""How a framework adapter's model asks for its calls: the options every path carries.

:class:`Caller` holds a model's :class:`~eclectus.adapters.connection.Connection` and its
:class:`CallOptions` (retries, request timeout, criteria, deadline) and runs calls with
them, the same way for ``invoke``/``complete``, their async twins and both kinds of stream:

- a call is *declared* by a function of the session (so a retry declares it again, on a
  fresh session, after a lost connection) and then *asked for* with the model's criteria
  and ``deadline_ms``;
- ``request_timeout`` bounds the wait for a call's text, or for each delta of a stream;
- a connection lost before a stream's first delta is retried like a call; once text has
  been yielded a lost connection is raised (the caller has already seen part of it).

Imports nothing from ``eclectus.server``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from eclectus.adapters.client import SemanticVariable, SyncSession
from eclectus.adapters.client.errors import ConnectionError as ClientConnectionError
from eclectus.adapters.connection import Connection
from eclectus.protocol import Criteria

T = TypeVar("T")
Declare = Callable[[SyncSession], Sequence[SemanticVariable]]
DeclareOne = Callable[[SyncSession], SemanticVariable]

DEFAULT_MAX_RETRIES = 2  # as langchain_openai's max_retries


@dataclass(frozen=True, slots=True)
class CallOptions:
    """What every call of one model carries besides its sampling. Validated here."""

    max_retries: int = DEFAULT_MAX_RETRIES
    """Further attempts after a lost connection (0: none)."""
    request_timeout: float | None = None
    """Seconds to wait for a call's text, or for each delta of a stream. None: no limit."""
    criteria: Criteria = "latency"
    """The objective of the gets: latency, throughput, or deadline (with deadline_ms)."""
    deadline_ms: float | None = None
    """With ``criteria="deadline"``: milliseconds from the get to the answer."""

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.request_timeout is not None and self.request_timeout <= 0:
            raise ValueError(f"request_timeout must be > 0, got {self.request_timeout}")
        if self.deadline_ms is not None and self.deadline_ms <= 0:
            raise ValueError(f"deadline_ms must be > 0, got {self.deadline_ms}")
        if (self.criteria == "deadline") != (self.deadline_ms is not None):
            raise ValueError("criteria='deadline' and deadline_ms go together")


class Caller:
    """Runs one model's calls on its connection with its options. Stateless apart from the
    connection's session; safe to share between threads and event loops."""

    def __init__(self, connection: Connection, options: CallOptions) -> None:
        self.connection = connection
        self.options = options

    @property
    def session(self) -> SyncSession:
        """The connection's session (mutates: connects on first use)."""
        return self.connection.session

    # -- retries ------------------------------------------------------------------------
    # One policy for every path, sync or async, call or stream: each try runs inside
    # ``with try_:`` (a plain context manager, so async code uses it too); a lost connection
    # drops the try's session and is swallowed while a try is left and nothing was yielded.

    def _tries(self) -> Iterator[_Try]:
        """The tries of one call: one, plus up to ``max_retries`` after lost connections."""
        for tries_left in range(self.options.max_retries, -1, -1):
            yield _Try(self.connection, last=tries_left == 0)

    def retrying(self, attempt: Callable[[SyncSession], T]) -> T:
        """``attempt(session)``, again on a fresh session after a lost connection, up to
        ``max_retries`` more times (blocking)."""
        for try_ in self._tries():
            with try_:
                return attempt(try_.open())
        raise AssertionError("unreachable: the last try returns or raises")

    async def aretrying(self, attempt: Callable[[SyncSession], Awaitable[T]]) -> T:
        """Async twin of :meth:`retrying` (connecting blocks the loop only for the
        handshake of a session not yet open)."""
        for try_ in self._tries():
            with try_:
                return await attempt(try_.open())
        raise AssertionError("unreachable: the last try returns or raises")

    # -- calls ----------------------------------------------------------------------------

    def run(self, declare: Declare) -> list[tuple[SemanticVariable, str]]:
        """Declares the calls, ships them with their gets in one frame and waits for every
        output (blocking; retried after a lost connection). Returns (output, text) pairs."""

        def attempt(session: SyncSession) -> list[tuple[SemanticVariable, str]]:
            outputs = list(declare(session))
            return list(zip(outputs, self.get(outputs), strict=True))

        return self.retrying(attempt)

    async def arun(self, declare: Declare) -> list[tuple[SemanticVariable, str]]:
        """Async twin of :meth:`run`."""

        async def attempt(session: SyncSession) -> list[tuple[SemanticVariable, str]]:
            outputs = list(declare(session))
            texts = await self.aget(outputs)
            return list(zip(outputs, texts, strict=True))

        return await self.aretrying(attempt)

    async def aget(self, outputs: Sequence[SemanticVariable]) -> list[str]:
        """The texts of already declared ``outputs`` (of one session) with this model's
        objective, from any event loop, bounded by ``request_timeout`` (no retry: the
        variables belong to their session)."""
        if not outputs:
            return []
        gets = outputs[0].session.aget_many(
            outputs, self.options.criteria, deadline_ms=self.options.deadline_ms
        )
        return await asyncio.wait_for(gets, self.options.request_timeout)

    def get(self, outputs: Sequence[SemanticVariable]) -> list[str]:
        """Blocking twin of :meth:`aget`."""
        if not outputs:
            return []
        return outputs[0].session.get_many(
            outputs,
            self.options.criteria,
            deadline_ms=self.options.deadline_ms,
            timeout=self.options.request_timeout,
        )

    # -- streams --------------------------------------------------------------------------

    def stream(self, declare: DeclareOne) -> Iterator[str | SemanticVariable]:
        """Text deltas of one declared call, then its finished output variable (blocking;
        ``request_timeout`` bounds each delta's wait; retried while nothing was yielded)."""
        for try_ in self._tries():
            with try_:
                var = declare(try_.open())
                for delta in self.deltas(var):
                    try_.yielded = True
                    yield delta
                yield var
                return

    async def astream(self, declare: DeclareOne) -> AsyncIterator[str | SemanticVariable]:
        """Async twin of :meth:`stream`."""
        for try_ in self._tries():
            with try_:
                var = declare(try_.open())
                async for delta in self.adeltas(var):
                    try_.yielded = True
                    yield delta
                yield var
                return

    def deltas(self, var: SemanticVariable) -> Iterator[str]:
        """The text deltas of a declared variable with this model's objective, each waited
        for at most ``request_timeout`` (blocking; no retry)."""
        return var.stream(
            self.options.criteria,
            deadline_ms=self.options.deadline_ms,
            timeout=self.options.request_timeout,
        )

    async def adeltas(self, var: SemanticVariable) -> AsyncIterator[str]:
        """Async twin of :meth:`deltas`: ``request_timeout`` bounds each delta's wait
        (TimeoutError; the stream is then closed, which cancels the call on the server)."""
        source = var.astream(self.options.criteria, deadline_ms=self.options.deadline_ms)
        try:
            while True:
                try:
                    delta = await asyncio.wait_for(anext(source), self.options.request_timeout)
                except StopAsyncIteration:
                    return
                yield delta
        finally:
            await source.aclose()  # type: ignore[attr-defined]


class _Try:
    """One try of a call (see :meth:`Caller._tries`): the session it opened, whether it has
    yielded text, and whether it is the last. Mutable; one per try."""

    def __init__(self, connection: Connection, last: bool) -> None:
        self.connection = connection
        self.last = last
        self.session: SyncSession | None = None  # None until connected
        self.yielded = False

    def open(self) -> SyncSession:
        """The connection's session (mutates: connects on first use; remembers it)."""
        self.session = self.connection.session
        return self.session

    def __enter__(self) -> _Try:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> bool:
        """After a lost connection: forget the session (None: connecting failed, nothing to
        drop) and swallow the error, so the next try runs, unless this try is the last or
        has yielded text (the caller has seen part of it). Other errors pass."""
        if kind is None or not issubclass(kind, ClientConnectionError):
            return False
        if self.session is not None:
            self.connection.forget(self.session)
        return not (self.last or self.yielded)
