"""Constants and helpers shared by the LlamaIndex adapter tests (a uniquely named module, so
that importing it never collides with another suite's conftest)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eclectus.server.app import EclectusServer
from eclectus.server.metrics import parse_prometheus

# Small enough that LlamaIndex's PromptHelper splits a few paragraphs into several chunks,
# so trees get more than one level and refine chains more than one step.
TEST_CONTEXT_WINDOW = 400
TEST_MAX_TOKENS = 12


def metric(server: EclectusServer, name: str) -> float:
    """The current value of one of the server's Prometheus counters."""
    return parse_prometheus(server.metrics_text()).get(name, 0.0)


def client_frames(server: EclectusServer) -> float:
    """Frames the server has received from all clients so far."""
    return metric(server, "eclectus_client_frames_total")


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
