"""The remote backend's exceptions: which failures fail over and which do not.

EngineDown        the engine is unreachable or broken (refused connection, timeout, 5xx,
                  a stream that ended early): the call fails over to another engine
EngineRejected    the engine refused this request (4xx): another engine would too, so the
                  call fails with ``engine_error``
RemoteStartError  the pool cannot start (nothing reachable, a tokenizer that does not
                  match): ``eclectus serve`` prints it as one line and exits 2
"""

from __future__ import annotations


class EngineDown(Exception):
    """An engine failed in a way that says nothing about the request: try another."""


class EngineRejected(Exception):
    """An engine refused the request itself (an HTTP 4xx); the message is the engine's."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class RemoteStartError(Exception):
    """The remote engines cannot be served (the message says which and why)."""
