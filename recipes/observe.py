"""What a run observed: calls counted on the client (a LangChain callback handler that also
shows progress) and the server's counters read from /metrics before and after."""

from __future__ import annotations

import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, TextIO
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from eclectus.server.front.metrics import parse_prometheus

PROGRESS_EVERY_S = 2.0  # between lines when stderr is not a terminal
CALLS_FINISHED = "eclectus_calls_finished_total"  # graph calls the server's scheduler finished


APP_TAG = "app:"  # a run tag "app:NAME" labels the calls under it (e.g. chat, analytics)
DEFAULT_LABEL = "model call"


@dataclass(frozen=True, slots=True)
class CallSpan:
    """One model call seen by the client: seconds since the run started, and which part of
    the app made it (its ``app:`` tag, else "model call")."""

    start_s: float
    end_s: float
    label: str = DEFAULT_LABEL


def label_of(tags: list[str] | None) -> str:
    """The part of the app a call belongs to, from its run's inherited tags (pure)."""
    found = [t.removeprefix(APP_TAG) for t in tags or () if t.startswith(APP_TAG)]
    return found[0] if found else DEFAULT_LABEL


class CallObserver(BaseCallbackHandler):
    """Counts model calls and records their spans; prints ``calls finished / total`` to
    ``stream`` (one line updated in place on a TTY, else a line every few seconds).

    A compiled chain's calls run on the server, where no client callback sees them: the
    count shown is the larger of the client's and the server's (:meth:`server_progress`,
    fed by :class:`ServerProgress`).

    Thread-safe: LangChain calls handlers from worker threads during ``batch``.
    """

    run_inline = True

    def __init__(
        self, total: int, label: str, stream: TextIO | None = None, show: bool = True
    ) -> None:
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.show = show
        self.spans: list[CallSpan] = []
        self._lock = threading.Lock()
        self._started: dict[UUID, tuple[float, str]] = {}
        self._t0 = time.perf_counter()
        self._last_print = 0.0
        self._server_calls = 0

    @property
    def num_calls(self) -> int:
        return len(self.spans)

    def server_progress(self, calls_finished: int) -> None:
        """The server has finished ``calls_finished`` calls of this run (mutates; prints)."""
        with self._lock:
            changed = calls_finished > self._server_calls
            self._server_calls = max(self._server_calls, calls_finished)
        if changed:
            self.print_progress()

    def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: UUID, **kw: Any) -> None:
        self._start(run_id, kw.get("tags"))

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, **kw: Any
    ) -> None:
        self._start(run_id, kw.get("tags"))

    def on_llm_end(self, response: Any, *, run_id: UUID, **kw: Any) -> None:
        now = time.perf_counter() - self._t0
        with self._lock:
            start, label = self._started.pop(run_id, (now, DEFAULT_LABEL))
            self.spans.append(CallSpan(start, now, label))
        self.print_progress()

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kw: Any) -> None:
        with self._lock:
            self._started.pop(run_id, None)

    def _start(self, run_id: UUID, tags: list[str] | None) -> None:
        with self._lock:
            self._started[run_id] = (time.perf_counter() - self._t0, label_of(tags))

    def print_progress(self, final: bool = False) -> None:
        """Write the progress line (mutates the stream; rate-limited off a TTY)."""
        if not self.show:
            return
        done = min(self.total, max(self.num_calls, self._server_calls))
        line = f"{self.label}: calls {done}/{self.total}"
        if self.stream.isatty():
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            now = time.perf_counter()
            if not final and now - self._last_print < PROGRESS_EVERY_S:
                return
            self._last_print = now
            self.stream.write(line + "\n")
        self.stream.flush()


def scrape(metrics_url: str) -> dict[str, float]:
    """An Eclectus server's /metrics page, parsed (blocking I/O)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        return parse_prometheus(response.read().decode())


class ServerProgress:
    """While open, reads an Eclectus server's finished-calls counter every ``every_s``
    seconds on a daemon thread and reports the calls finished since it opened to
    ``observer`` (a compiled graph's calls are seen only there). A failed read is skipped:
    progress is a display, never a reason to fail the run."""

    def __init__(self, metrics_url: str, observer: CallObserver, every_s: float = 1.0) -> None:
        self.metrics_url = metrics_url
        self.observer = observer
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="progress", daemon=True)
        self._before = 0

    def __enter__(self) -> ServerProgress:
        self._before = self._read() or 0
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        after = self._read()
        if after is not None:
            self.observer.server_progress(after - self._before)

    def _read(self) -> int | None:
        try:
            return int(scrape(self.metrics_url).get(CALLS_FINISHED, 0))
        except OSError:
            return None

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            now = self._read()
            if now is not None:
                self.observer.server_progress(now - self._before)


@dataclass(frozen=True, slots=True)
class ServerDelta:
    """Server counters over one run (after minus before)."""

    counters: dict[str, float] = field(default_factory=dict)

    @classmethod
    def between(cls, before: dict[str, float], after: dict[str, float]) -> ServerDelta:
        names = [n for n in after if n.endswith("_total") and "{" not in n]
        return cls({n: after[n] - before.get(n, 0.0) for n in names})

    def get(self, short: str) -> int:
        return int(self.counters.get(f"eclectus_{short}_total", 0))

    @property
    def calls(self) -> int:
        """Graph calls the scheduler finished (the OpenAI endpoint bypasses it)."""
        return self.get("calls_finished")

    @property
    def cache_hit_ratio(self) -> float | None:
        """Prompt tokens served from the prefix cache / prompt tokens (None: no prompts)."""
        prompt = self.get("prompt_tokens")
        return self.get("prefix_cache_hit_tokens") / prompt if prompt else None
