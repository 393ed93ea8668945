"""Watching what a real in-process server sends its engine, for the adapter tests (a uniquely
named module at tests/adapters, importable from every suite below it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eclectus.server.app import EclectusServer


@contextmanager
def engine_prompts(server: EclectusServer) -> Iterator[list[tuple[str, ...]]]:
    """The segments of every engine request the server makes while inside, as the engine
    receives them (variables resolved): what the model reads, cut where the client cut it."""
    backend: Any = server.backend
    seen: list[tuple[str, ...]] = []
    original = backend.generate

    def recording(request: Any) -> Any:
        seen.append(tuple(request.segments))
        return original(request)

    backend.generate = recording
    try:
        yield seen
    finally:
        del backend.generate
