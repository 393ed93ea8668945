"""How a framework adapter's model asks for its calls: the options every path carries.

:class:`Caller` holds a model's :class:`~eclectus.adapters.connection.Connection` and its
:class:`CallOptions` (retries, request timeout, criteria, deadline) and runs calls with
them, the same way for ``invoke``/``complete``, their async twins and both kinds of stream
(one async implementation; the sync entry points block on it through :meth:`Caller.block`
and :meth:`Caller.iterate`):

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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from eclectus.adapters.client import SemanticVariable, SyncSession
from eclectus.adapters.client.errors import ConnectionError as ClientConnectionError
from eclectus.adapters.connection import Connection
from eclectus.protocol import Criteria, ModelCard

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
    connection's session; safe to share between threads and event loops.

    Its calls are coroutines and async iterators, awaitable from any event loop; a sync
    entry point blocks on the same ones through :meth:`block` and :meth:`iterate`, which run
    them on the connection's loop (from any thread but that loop's own, a running loop's
    included). A ``declare`` function then runs on that loop too: it only declares (no
    blocking call)."""

    def __init__(self, connection: Connection, options: CallOptions) -> None:
        self.connection = connection
        self.options = options

    @property
    def session(self) -> SyncSession:
        """The connection's session (blocking: connects on first use)."""
        return self.connection.session

    def served_models(self) -> list[ModelCard]:
        """The models the server announced in its welcome (no I/O once a session is open;
        else blocking: connects, with the model's retries)."""
        session = self.connection.current
        if session is not None:  # also what a declare function on the loop reads
            return session.models

        async def models(session: SyncSession) -> list[ModelCard]:
            return session.models

        return self.block(lambda: self.aretrying(models))

    # -- the bridge: sync entry points block on the async calls ---------------------------

    def block(self, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """``work()`` run to its end on the connection's loop (blocking; RuntimeError on that
        loop's own thread, where it would deadlock)."""
        return self.connection.bridge.block(work, None)

    def iterate(self, source: AsyncIterator[T]) -> Iterator[T]:
        """``source``'s items, each waited for on the connection's loop (blocking); stopping
        early closes ``source`` there."""
        return self.connection.bridge.iter_blocking(source, None)

    # -- retries ------------------------------------------------------------------------
    # One policy for every path, call or stream: each try runs inside ``with try_:``; a lost
    # connection drops the try's session and is swallowed while a try is left and nothing
    # was yielded.

    def _tries(self) -> Iterator[_Try]:
        """The tries of one call: one, plus up to ``max_retries`` after lost connections."""
        for tries_left in range(self.options.max_retries, -1, -1):
            yield _Try(self.connection, last=tries_left == 0)

    async def aretrying(self, attempt: Callable[[SyncSession], Awaitable[T]]) -> T:
        """``await attempt(session)``, again on a fresh session after a lost connection, up
        to ``max_retries`` more times."""
        for try_ in self._tries():
            with try_:
                return await attempt(await try_.open())
        raise AssertionError("unreachable: the last try returns or raises")

    # -- calls ----------------------------------------------------------------------------

    async def arun(self, declare: Declare) -> list[tuple[SemanticVariable, str]]:
        """Declares the calls, ships them with their gets in one frame and waits for every
        output (retried after a lost connection). Returns (output, text) pairs."""

        async def attempt(session: SyncSession) -> list[tuple[SemanticVariable, str]]:
            outputs = list(declare(session))
            texts = await self.aget(outputs)
            return list(zip(outputs, texts, strict=True))

        return await self.aretrying(attempt)

    async def aget(self, outputs: Sequence[SemanticVariable]) -> list[str]:
        """The texts of already declared ``outputs`` (of one session) with this model's
        objective, bounded by ``request_timeout`` (no retry: the variables belong to their
        session)."""
        if not outputs:
            return []
        gets = outputs[0].session.aget_many(
            outputs, self.options.criteria, deadline_ms=self.options.deadline_ms
        )
        return await asyncio.wait_for(gets, self.options.request_timeout)

    # -- streams --------------------------------------------------------------------------

    async def astream(self, declare: DeclareOne) -> AsyncIterator[str | SemanticVariable]:
        """Text deltas of one declared call, then its finished output variable
        (``request_timeout`` bounds each delta's wait; retried while nothing was yielded)."""
        for try_ in self._tries():
            with try_:
                var = declare(await try_.open())
                async for delta in self.adeltas(var):
                    try_.yielded = True
                    yield delta
                yield var
                return

    async def adeltas(self, var: SemanticVariable) -> AsyncIterator[str]:
        """The text deltas of a declared variable with this model's objective (no retry):
        ``request_timeout`` bounds each delta's wait (TimeoutError; the stream is then
        closed, which cancels the call on the server)."""
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

    async def open(self) -> SyncSession:
        """The connection's session (mutates: connects on first use; remembers it)."""
        self.session = await self.connection.asession()
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
