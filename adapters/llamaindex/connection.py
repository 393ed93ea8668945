"""The LLM's link to the server: one SDK session, opened on first use, shared by all callers.

LlamaIndex calls an LLM from plain threads, from its own event loops (``asyncio_run`` makes a
fresh one per call) and from the application's loop. The SDK's ``connect_sync`` session
runs its socket on a background loop and lets ``aget``/``astream`` be awaited from any loop,
so a single session serves every caller, and all calls of one LLM object are one
application session on the server (which is what lets it see them as one graph).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from eclectus.adapters.client import Gen, SyncSession, connect_sync


@dataclass(frozen=True, slots=True)
class Sampling:
    """How one output is generated; the fields of the SDK's ``Gen`` (see docs/protocol.md)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def gen(self) -> Gen:
        """A fresh ``Gen`` placeholder for one call (pure)."""
        return Gen(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=list(self.stop),
        )


class Connection:
    """A lazily opened SDK session. Thread-safe: the first caller opens it, the rest wait."""

    def __init__(self, url: str, token: str | None, app: str | None) -> None:
        self._url = url
        self._token = token
        self._app = app
        self._lock = threading.Lock()
        self._session: SyncSession | None = None

    @property
    def session(self) -> SyncSession:
        """The open session (mutates: connects on first use, and again after the server
        closed the previous one)."""
        with self._lock:
            if self._session is None or self._session.closed:
                self._session = connect_sync(self._url, token=self._token, app=self._app)
            return self._session

    def close(self) -> None:
        """Close the session if open (mutates; idempotent)."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()
