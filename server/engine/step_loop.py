"""StepLoop: the built-in engine's one step loop, whoever hosts it.

One thread owns the LLMEngine and steps it while work exists, sleeping on a condition when
idle. Other threads reach it only through :meth:`StepLoop.submit` (add, abort, unpin,
reset_cache; applied in arrival order at the start of the next iteration) and
:meth:`StepLoop.stop`. What one iteration produced (outputs, and the failures that end
requests) goes to the host's :class:`OutputSink` in one call at the iteration's end, with the
stats taken after it: AsyncEngine puts the items into its requests' asyncio queues, the
engine core process sends them down its pipe as one message.

A step that raises fails only the requests in that step; a request whose own parameters break
sampling fails alone; a request the engine cannot take fails at its add; the loop keeps going.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from eclectus.protocol import SamplingParams
from eclectus.server.engine.llm_engine import LLMEngine, StepFailed
from eclectus.server.engine.request import (
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestFailed,
    RequestRefused,
)

if TYPE_CHECKING:  # xgrammar is imported on the first constrained request
    from eclectus.server.engine.structured import GrammarState

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepCommand:
    """What another thread asks of the step loop; applied in arrival order at the start of
    the next iteration."""

    kind: Literal["add", "abort", "unpin", "reset_cache"]
    request_id: str = ""
    request: EngineRequest | None = None
    grammar: GrammarState | None = None  # "add": its matcher, built off the step thread


class OutputSink(Protocol):
    """Where a step loop's outputs go (called on the step thread)."""

    def __call__(self, items: Sequence[EngineOutput | RequestFailed], stats: EngineStats) -> None:
        """Take one iteration's outputs and failures, in order, and the stats after them
        (mutates the host; called every iteration, ``items`` possibly empty)."""


class StepLoop:
    """Steps ``engine`` on the thread that calls :meth:`run`; outputs go to ``sink``."""

    def __init__(self, engine: LLMEngine, sink: OutputSink) -> None:
        self.engine = engine
        self._sink = sink
        self._cond = threading.Condition()
        self._inbox: list[StepCommand] = []  # guarded by _cond
        self._stopping = False  # guarded by _cond
        self._items: list[EngineOutput | RequestFailed] = []  # the step thread's only
        self._stats = engine.stats()  # replaced (never mutated) every iteration

    @property
    def stats(self) -> EngineStats:
        """The snapshot taken at the end of the latest iteration (pure; any thread)."""
        return self._stats

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called (pure; any thread)."""
        with self._cond:
            return self._stopping

    def prepare_grammar(self, sampling: SamplingParams) -> GrammarState | None:
        """Compile ``sampling``'s constraint (cached) and build its matcher, for an ``add``;
        None when it has none. Raises RequestRefused when it does not compile or its
        ``max_tokens`` cannot hold a valid output (blocking; any thread but the step's)."""
        try:
            return self.engine.prepare_grammar(sampling)
        except ValueError as exc:  # GrammarError: what xgrammar refused, or the budget
            raise RequestRefused(str(exc)) from None

    def submit(self, command: StepCommand) -> None:
        """Queue ``command`` for the next iteration and wake the loop (mutates; any thread)."""
        with self._cond:
            self._inbox.append(command)
            self._cond.notify()

    def stop(self) -> None:
        """Make :meth:`run` return at its next iteration; queued commands are dropped
        (mutates; idempotent; any thread)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def run(self) -> None:
        """Step until :meth:`stop` (blocking: the calling thread is the step thread)."""
        while True:
            with self._cond:
                while not self._inbox and not self.engine.has_unfinished and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                commands, self._inbox = self._inbox, []
            for command in commands:
                self._apply(command)
            if self.engine.has_unfinished:
                self._step()
            # stats first: whoever reads them after seeing an output must see its tokens
            self._stats = self.engine.stats()
            items, self._items = self._items, []
            self._sink(items, self._stats)

    def _apply(self, command: StepCommand) -> None:
        if command.kind == "add":
            assert command.request is not None
            try:
                self.engine.add_request(command.request, command.grammar)
            except Exception as exc:  # bad request or tokenizer error: fail it, live on
                self._fail(command.request_id, f"{type(exc).__name__}: {exc}")
        elif command.kind == "abort":
            output = self.engine.abort(command.request_id)
            if output is not None:
                self._items.append(output)
        elif command.kind == "unpin":
            self.engine.unpin(command.request_id)
        else:
            forgotten = self.engine.reset_prefix_cache()
            logger.info("prefix cache reset: %d cached blocks forgotten", forgotten)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except StepFailed as exc:
            logger.exception("engine step failed; failing its %d requests", len(exc.request_ids))
            outputs = exc.outputs
            for request_id in exc.request_ids:
                self._fail(request_id, str(exc))
        except Exception as exc:  # a bug outside the forward: fail everything in flight
            logger.exception("engine loop error; failing all requests")
            for request_id in sorted(self.engine.request_ids):
                self.engine.abort(request_id)
                self._fail(request_id, f"engine error: {exc}")
            outputs = []
        for output in outputs:
            if output.finish_reason == "error":  # failed alone by its own parameters
                self._fail(output.request_id, self.engine.pop_failure(output.request_id))
            else:
                self._items.append(output)

    def _fail(self, request_id: str, message: str) -> None:
        self._items.append(RequestFailed(request_id, message))
