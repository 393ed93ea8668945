"""The server's exception tree. Each carries the wire error code it maps to, so the session
turns any of them into an ``error`` frame in one place (session.py ``_error_frame``).

    ServerError            code given per instance (bad_request, unknown_type, ...)
    ├── GraphError         the graph rejects a fragment, set, get or cancel
    └── LimitError         a configured limit would be exceeded (code limit_exceeded)
"""

from __future__ import annotations

from eclectus.protocol import ErrorCode


class ServerError(Exception):
    """A request the server refuses; ``field``/``var`` name what was wrong."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        field: str | None = None,
        var: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.field = field
        self.var = var


class GraphError(ServerError):
    """A graph fragment, set, get or cancel is invalid (nothing of it was applied)."""


class LimitError(ServerError):
    """A limit from ServerConfig would be exceeded."""

    def __init__(self, message: str, *, field: str | None = None, var: str | None = None) -> None:
        super().__init__("limit_exceeded", message, field=field, var=var)
