"""Where the server is and which session a framework adapter's call runs in.

The LangChain and LlamaIndex adapters both stand on this module (and on :mod:`.calls` and
:mod:`.sampling`); neither keeps a policy of its own.

- **Where**: a ``ws(s)://`` or ``http(s)://`` URL (``http`` becomes ``ws``, an OpenAI-style
  ``/v1`` suffix is dropped: the protocol is served on any path). Default ``$ECLECTUS_URL``,
  else the local ``eclectus serve``; the token defaults to ``$ECLECTUS_TOKEN``.
- **Sessions**: one :class:`Connection` per (server URL, token, application name) in the
  process (:func:`connection_for`). It opens its session on first use (the first caller
  connects, concurrent ones wait), and opens a fresh one once the server closed the old one
  or the connection was lost. A session belongs to these settings rather than to a Python
  model object: LangChain copies and rebuilds model objects freely (``configurable_fields``
  builds one per call), and a session per object would open a socket and a thread per call.
  Give a model its own ``app`` name to give it a session of its own. Its sessions live on
  the connection's own event-loop thread, where the adapters' async logic also runs when a
  sync entry point blocks on it (:attr:`Connection.bridge`).
- **Lifetime**: the registry holds a Connection while its session is open, and otherwise
  only while something else does (a model object, a call in progress). Once its session is
  closed (:meth:`Connection.close`) or lost, and no one holds it, it is freed, and its
  thread stops when the work on it has finished: a process that opens apps by many names
  keeps only the open ones. Any model with the same settings meanwhile gets the same
  Connection, so sharing holds for as long as there is anything to share.

Imports nothing from ``eclectus.server``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref

from eclectus.adapters.client import DEFAULT_URL, Session, SyncSession
from eclectus.adapters.client.bridge import LoopBridge, LoopThread
from eclectus.adapters.client.connect import TOKEN_ENV, open_session

URL_ENV = "ECLECTUS_URL"

ConnectionKey = tuple[str, str | None, str | None]  # (ws URL, token, application)


def default_url() -> str:
    """``$ECLECTUS_URL``, else the local default server (reads the environment)."""
    return os.environ.get(URL_ENV) or DEFAULT_URL


def default_token() -> str | None:
    """``$ECLECTUS_TOKEN``, or None when unset or empty (reads the environment)."""
    return os.environ.get(TOKEN_ENV) or None


def ws_url(url: str) -> str:
    """The ``ws(s)://`` URL for a ``ws``/``http`` base URL; a trailing ``/`` and an
    OpenAI-style ``/v1`` suffix (a ``VLLMOpenAI`` base_url) are dropped. Pure."""
    for old, new in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(old):
            url = new + url[len(old) :]
    return url.removesuffix("/").removesuffix("/v1")


class Connection:
    """One lazily opened SDK session to one server as one application, on the
    connection's own event-loop thread (started on first use, kept for later sessions).

    Thread-safe: the first caller opens the session, concurrent callers wait for it. The
    adapters' logic is async and runs through :attr:`bridge`: awaited from any event loop
    (:meth:`LoopBridge.run`), or blocked on from any thread but the connection's own
    (:meth:`LoopBridge.block`, the sync entry points), which then runs it on this loop,
    beside the session.
    """

    def __init__(self, url: str, token: str | None, app: str | None) -> None:
        self.url = ws_url(url)
        self.token = token
        self.app = app
        self._lock = threading.Lock()  # held briefly, never across a wait
        self._loop: LoopThread | None = None
        self._opening: asyncio.Lock | None = None  # serialises opens, on the loop
        self._session: SyncSession | None = None

    @property
    def key(self) -> ConnectionKey:
        return (self.url, self.token, self.app)

    @property
    def bridge(self) -> LoopBridge:
        """Runs work on the connection's loop (mutates: starts its thread on first use)."""
        with self._lock:
            if self._loop is None:
                self._loop = LoopThread(name="eclectus-connection")
                # the thread must not outlive the connection; at exit it dies as a daemon
                weakref.finalize(self, self._loop.stop_when_idle).atexit = False
            return self._loop.bridge

    @property
    def current(self) -> SyncSession | None:
        """The session if one is open, else None (pure: never connects)."""
        with self._lock:
            session = self._session
        return session if session is not None and not session.closed else None

    @property
    def session(self) -> SyncSession:
        """The open session (blocking: connects on first use, and again once the previous
        session was closed or forgotten; not on the connection's own loop). Raises the
        SDK's ConnectionError/AuthError."""
        return self.current or self.bridge.block(self._open_here, None)

    async def asession(self) -> SyncSession:
        """:attr:`session` from any event loop, without blocking it."""
        return self.current or await self.bridge.run(self._open_here)

    async def _open_here(self) -> SyncSession:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:  # concurrent first users wait for one handshake
            session = self.current
            if session is None:
                opened = await open_session(self.url, token=self.token, app=self.app)
                session = SyncSession(opened, None)
                with self._lock:
                    self._session = session
                _keep(asyncio.get_running_loop().create_task(self._held_until_closed(opened)))
            return session

    async def _held_until_closed(self, session: Session) -> None:
        """Waits for ``session`` to end (closed here, by the server, or lost): while it
        waits, this coroutine keeps the Connection alive, hence registered, though no model
        holds it."""
        await session.wait_closed()

    def forget(self, session: SyncSession) -> None:
        """Drops ``session`` after its connection broke, so the next call reconnects
        (mutates; a session already replaced is left alone)."""
        with self._lock:
            if self._session is session:
                self._session = None

    def close(self) -> None:
        """Closes the session if one is open (mutates; idempotent; blocking). A later call
        reconnects; with nothing holding the connection, the registry frees it."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()

    def __repr__(self) -> str:
        return f"Connection({self.url!r}, app={self.app!r})"


_registry_lock = threading.Lock()
_registry: weakref.WeakValueDictionary[ConnectionKey, Connection] = weakref.WeakValueDictionary()
_watchers: set[asyncio.Task[None]] = set()  # one per open session (the loop holds tasks weakly)


def _keep(task: asyncio.Task[None]) -> None:
    _watchers.add(task)
    task.add_done_callback(_watchers.discard)


def connection_for(url: str, token: str | None, app: str | None) -> Connection:
    """The process's Connection for (url, token, app), created on first use (mutates the
    registry; opens nothing: the session opens on the first call)."""
    key = (ws_url(url), token, app)
    with _registry_lock:
        connection = _registry.get(key)
        if connection is None:
            connection = _registry[key] = Connection(url, token, app)
        return connection


def open_connections() -> list[Connection]:
    """The Connections alive in this process: those with an open session and those still
    held (pure snapshot, for tests and tools)."""
    with _registry_lock:
        return list(_registry.values())
