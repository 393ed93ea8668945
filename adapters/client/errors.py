"""The SDK's exception tree.

::

    EclectusClientError
    ├── ConnectionError      the socket failed, closed, or the handshake timed out
    │   │                    (also a builtins.ConnectionError, so ``except OSError`` sees it)
    │   └── ConnectionLost   ... under an open session: the server went away or died, or
    │                        the network dropped (.url, .close_code, .close_reason)
    ├── AuthError            the server answered ``hello`` with ``unauthorized``
    └── ServerError          an ``error`` frame: .code, .message, .field, .var
        └── VariableFailed   ... that failed one variable (aget/get/astream raise it)

Bad arguments are ordinary Python errors raised at the call site: ``ValueError`` for a bad
template or sampling spec (at ``app.function()``), ``TypeError`` for unknown, missing or
ill-typed inputs (when a semantic function is called).
"""

from __future__ import annotations

import builtins

from eclectus.protocol import Error


class EclectusClientError(Exception):
    """Base of every error the SDK raises on its own account."""


class ConnectionError(EclectusClientError, builtins.ConnectionError):
    """The connection is gone (or never came up); everything still pending failed with it."""


class ConnectionLost(ConnectionError):
    """The connection of an open session dropped: the server shut down or died, or the
    network failed. Everything the session had pending failed with it, and its graph on the
    server is gone: a new session must declare the work again (see docs/sdk.md, "Connection
    loss"). ``close_code`` is the server's close code, None when no close frame arrived."""

    def __init__(self, url: str, close_code: int | None, close_reason: str = "") -> None:
        super().__init__(f"connection to {url} lost: {_cause(close_code, close_reason)}; {_GONE}")
        self.url = url
        self.close_code = close_code
        self.close_reason = close_reason

    def renewed(self) -> ConnectionLost:
        """The same error as a new instance, for each later use of the dead session (pure)."""
        return ConnectionLost(self.url, self.close_code, self.close_reason)


_GONE = "the session's graph on the server is gone with it (open a new session)"
_CLOSE_CAUSES = {
    1000: "the server closed the session",
    1001: "the server is shutting down (close code 1001)",
    1008: "the server refused the session (close code 1008: policy violation)",
    1011: "the server failed (close code 1011: internal error)",
}


def _cause(close_code: int | None, close_reason: str) -> str:
    """A reader's words for a close code (pure)."""
    if close_code is None or close_code == 1006:  # 1006: no close frame arrived
        return "no close frame (the server process died or the network dropped)"
    cause = _CLOSE_CAUSES.get(close_code, f"the server closed it (close code {close_code})")
    return f"{cause}: {close_reason}" if close_reason else cause


class AuthError(EclectusClientError):
    """The server refused the ``hello`` (bad or missing token). ``code`` is the wire code."""

    def __init__(self, message: str, code: str = "unauthorized") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ServerError(EclectusClientError):
    """The server answered a frame with ``error``.

    ``code`` is the protocol's error code (``bad_request``, ``cycle``, ``engine_error``...),
    ``field`` the offending field when the server named one, ``var`` the variable it concerns.
    """

    def __init__(
        self, code: str, message: str, *, field: str | None = None, var: str | None = None
    ) -> None:
        where = "".join(
            [f" (field {field!r})" if field else "", f" (variable {var!r})" if var else ""]
        )
        super().__init__(f"[{code}] {message}{where}")
        self.code = code
        self.message = message
        self.field = field
        self.var = var

    @classmethod
    def from_frame(cls, frame: Error, *, var: str | None = None) -> ServerError:
        """Builds the error from a wire ``error`` frame; ``var`` overrides the frame's var
        (used when a rejected submit fails each of its variables). Pure."""
        return cls(frame.code, frame.message, field=frame.field, var=var or frame.var)


class SessionRefused(ServerError):
    """The server refused the session for load (``limit_exceeded`` at hello: its sessions,
    or its tenant's, are at their cap; or HTTP 429: its connections are), every time it was
    tried: ``retries`` retries with backoff. Retryable later; raise the server's caps or
    run more front processes (docs/protocol.md, "Limits")."""

    def __init__(self, message: str, retries: int) -> None:
        super().__init__("limit_exceeded", f"{message} (refused {retries + 1} times)")
        self.retries = retries


class VariableFailed(ServerError):
    """A variable will never get a value: its producer (or something upstream) failed, the
    fragment that declared it was rejected, or it was cancelled. ``var`` is its id."""
