"""Engine-side call spans of an Eclectus server, for the timeline of a compiled run.

A compiled LangChain app sends its whole graph in one frame, so the client never sees its
calls one by one. :class:`TracingBackend` wraps the server's engine and appends one JSON line
per finished engine request to a file — wall-clock start, first token and end (``time.time``,
so the harness in another process can place them in its runs), and the prompt and output
token counts. It only observes: every method delegates to the wrapped engine unchanged.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eclectus.server.backend import Backend, EngineOutput, EngineRequest


@dataclass(frozen=True, slots=True)
class EngineSpan:
    """One engine request as the server saw it (seconds since the epoch)."""

    start: float
    first_token: float
    end: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    background: bool = False  # throughput work nobody waits on (EngineRequest.background)


class TracingBackend:
    """A Backend that records an :class:`EngineSpan` per finished request to ``path``
    (appends; thread-safe). Everything else is the wrapped backend's."""

    def __init__(self, inner: Backend, path: Path) -> None:
        self._inner = inner
        self._path = path
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Delegate, stamping the first and the last output (mutates: the trace file)."""
        start, first = time.time(), 0.0
        async for output in self._inner.generate(request):
            first = first or time.time()
            if output.finished:
                self._record(
                    EngineSpan(
                        start,
                        first,
                        time.time(),
                        output.num_prompt_tokens,
                        output.num_cached_tokens,
                        output.num_output_tokens,
                        request.background,
                    )
                )
            yield output

    def _record(self, span: EngineSpan) -> None:
        line = json.dumps(asdict(span)) + "\n"
        with self._lock, self._path.open("a", encoding="utf-8") as out:
            out.write(line)


def read_spans(path: Path, since: float, until: float) -> list[EngineSpan]:
    """The spans in ``path`` that started within [since, until] (pure: reads the file)."""
    if not path.exists():
        return []
    spans = [EngineSpan(**json.loads(line)) for line in path.read_text().splitlines() if line]
    return [s for s in spans if since <= s.start <= until]


def idle_within(spans: list[tuple[float, float]], total_s: float) -> float:
    """Seconds of ``[0, total_s]`` that no span covers (pure): in a run of one app, the time
    its engine had none of its calls: client round trips, client code, dispatch."""
    covered, reach = 0.0, 0.0
    for start, end in sorted(spans):
        start, end = max(start, reach), min(end, total_s)
        if end > start:
            covered += end - start
            reach = end
    return max(0.0, total_s - covered)
