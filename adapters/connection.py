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
  Give a model its own ``app`` name to give it a session of its own.

Imports nothing from ``eclectus.server``.
"""

from __future__ import annotations

import os
import threading

from eclectus.adapters.client import DEFAULT_URL, SyncSession, connect_sync
from eclectus.adapters.client.connect import TOKEN_ENV

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
    """One lazily opened SDK session to one server as one application.

    Thread-safe: the first caller opens the session, concurrent callers wait for it. The
    session is a ``connect_sync`` session, so its blocking methods work from any thread and
    its async ones from any event loop.
    """

    def __init__(self, url: str, token: str | None, app: str | None) -> None:
        self.url = ws_url(url)
        self.token = token
        self.app = app
        self._lock = threading.Lock()
        self._session: SyncSession | None = None

    @property
    def key(self) -> ConnectionKey:
        return (self.url, self.token, self.app)

    @property
    def session(self) -> SyncSession:
        """The open session (mutates: connects on first use, and again once the previous
        session was closed or forgotten). Raises the SDK's ConnectionError/AuthError."""
        with self._lock:
            if self._session is None or self._session.closed:
                self._session = connect_sync(self.url, token=self.token, app=self.app)
            return self._session

    def forget(self, session: SyncSession) -> None:
        """Drops ``session`` after its connection broke, so the next call reconnects
        (mutates; a session already replaced is left alone)."""
        with self._lock:
            if self._session is session:
                self._session = None

    def close(self) -> None:
        """Closes the session if one is open (mutates; idempotent). A later call
        reconnects."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()

    def __repr__(self) -> str:
        return f"Connection({self.url!r}, app={self.app!r})"


_registry_lock = threading.Lock()
_registry: dict[ConnectionKey, Connection] = {}


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
    """The Connections made so far in this process (pure snapshot, for tests and tools)."""
    with _registry_lock:
        return list(_registry.values())
