"""The blocking face of a session on a background event-loop thread.

``connect_sync(url)`` starts a daemon thread running its own event loop, opens the session
there and returns a :class:`SyncSession`. Declaring is the Session's own methods, the same
signatures and the same code (:class:`_OfSession`); asking blocks the calling thread
(``var.get()``, ``var.stream()``, ``app.get_many()``) through the one bridge (bridge.py).
Because the session lives on its own loop, its variables' async methods (``aget``,
``astream``) also work from any other event loop, so one sync-capable session can serve both
the sync and the async entry points of a framework adapter.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from eclectus.adapters.client.bridge import LoopThread
from eclectus.adapters.client.connect import DEFAULT_RETRIES, DEFAULT_TIMEOUT, open_session
from eclectus.adapters.client.session import Session
from eclectus.protocol import Limits, ModelCard

P = ParamSpec("P")
R = TypeVar("R")


class _OfSession(Generic[P, R]):
    """A Session method offered by SyncSession as it is: called on the SyncSession's
    session, with its signature and docstring (no I/O of its own)."""

    def __init__(self, method: Callable[Concatenate[Session, P], R]) -> None:
        self._method = method
        functools.update_wrapper(self, method)

    @overload
    def __get__(self, owner: None, kind: type[Any]) -> _OfSession[P, R]: ...

    @overload
    def __get__(self, owner: SyncSession, kind: type[Any]) -> Callable[P, R]: ...

    def __get__(
        self, owner: SyncSession | None, kind: type[Any]
    ) -> _OfSession[P, R] | Callable[P, R]:
        if owner is None:
            return self
        return functools.partial(self._method, owner.session)


class SyncSession:
    """A Session driven from ordinary threads. ``.session`` is the underlying async Session
    (its async methods work from any event loop). ``loop_thread``: the thread its loop runs
    on when this SyncSession owns it (``connect_sync``; closing stops it), else None (the
    adapters' connection keeps its loop for the next session)."""

    def __init__(self, session: Session, loop_thread: LoopThread | None) -> None:
        self._session = session
        self._loop_thread = loop_thread

    @property
    def session(self) -> Session:
        return self._session

    @property
    def models(self) -> list[ModelCard]:
        return self._session.models

    @property
    def limits(self) -> Limits:
        return self._session.limits

    @property
    def session_id(self) -> str:
        return self._session.session_id

    @property
    def server_version(self) -> str:
        return self._session.server_version

    @property
    def url(self) -> str:
        return self._session.url

    @property
    def num_pending(self) -> int:
        return self._session.num_pending

    @property
    def num_frames_sent(self) -> int:
        return self._session.num_frames_sent

    @property
    def closed(self) -> bool:
        return self._session.closed

    # -- declaring: the Session's own calls (no I/O) ---------------------------------------

    function = _OfSession(Session.function)
    call = _OfSession(Session.call)
    variable = _OfSession(Session.variable)
    join = _OfSession(Session.join)
    repr_list = _OfSession(Session.repr_list)
    new_variable = _OfSession(Session.new_variable)
    map = _OfSession(Session.map)
    map_steps = _OfSession(Session.map_steps)
    map_pipeline = _OfSession(Session.map_pipeline)
    switch = _OfSession(Session.switch)
    retract = _OfSession(Session.retract)

    # -- asking: blocking --------------------------------------------------------------------

    get_many = _OfSession(Session.get_many)  # blocking already (not on the session's loop)

    def flush(self, *, timeout: float | None = None) -> None:
        """Blocking: ships what is pending and waits for the server's ack."""
        self._session.bridge.block(self._session.flush, timeout)

    def tokenize(
        self, text: str, *, model: str | None = None, timeout: float | None = None
    ) -> list[int]:
        """Blocking: the server's token ids of ``text``."""
        return self._session.bridge.block(
            lambda: self._session.tokenize(text, model=model), timeout
        )

    def count_tokens(
        self, text: str, *, model: str | None = None, timeout: float | None = None
    ) -> int:
        """Blocking: the server's token count of ``text``."""
        return self._session.bridge.block(
            lambda: self._session.count_tokens(text, model=model), timeout
        )

    def close(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        """Closes the session, and stops its loop thread if it owns one (idempotent)."""
        if not self._session.bridge.loop.is_closed():
            try:
                self._session.bridge.block(self._session.aclose, timeout)
            finally:
                if self._loop_thread is not None:
                    self._loop_thread.stop()

    def __enter__(self) -> SyncSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def connect_sync(
    url: str,
    *,
    token: str | None = None,
    app: str | None = None,
    tenant: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = DEFAULT_RETRIES,
) -> SyncSession:
    """Blocking :func:`connect`: the session runs on a new background loop thread. Use as
    ``with connect_sync(url) as app:`` or call ``app.close()``. Same errors and retries as
    connect."""
    loop_thread = LoopThread()
    opening = functools.partial(
        open_session, url, token=token, app=app, tenant=tenant, timeout=timeout, retries=retries
    )
    try:  # open_session bounds its own wait by ``timeout``
        session = loop_thread.bridge.block(opening, None)
    except BaseException:
        loop_thread.stop()
        raise
    return SyncSession(session, loop_thread)
