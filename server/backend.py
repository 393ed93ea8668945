"""The one small async interface through which the scheduler reaches an engine.

The built-in engine (``eclectus.server.engine.AsyncEngine``, ``ProcessEngine``) and the
remote pool (``eclectus.server.remote.RemoteBackend``) implement it; scheduler unit tests use
a scripted engine. A backend takes token ids only: the server's front
(:mod:`eclectus.server.front.prompt`) owns the tokenizer, the chat template and the ``ModelCard``,
and turns every prompt's text into ids once. The request and output types are the engine's
(:mod:`eclectus.server.engine.request`, torch-free), named here for everything above it;
nothing here loads torch or the engine itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from eclectus.protocol import ErrorCode, SamplingParams
from eclectus.server.engine.request import (
    EngineCapacity,
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestRefused,
)

__all__ = [
    "Backend",
    "EngineCapacity",
    "EngineError",
    "EngineOutput",
    "EngineRequest",
    "EngineStats",
    "EngineUnavailableError",
    "RequestRefused",
    "check_constraint",
]


class EngineUnavailableError(EngineError):
    """No engine can take the request (every remote engine is down); retrying later may
    succeed."""

    code: ErrorCode = "engine_unavailable"


class Backend(Protocol):
    """What the scheduler needs from an engine. Methods that change state say so."""

    @property
    def max_model_len(self) -> int:
        """The most tokens one request may hold, prompt and output (the context window, and
        for the built-in engine the KV pool); known once :meth:`start` has run (pure)."""
        ...

    async def start(self) -> None:
        """Start the engine's step loop (mutates: starts a thread or task)."""

    async def shutdown(self) -> None:
        """Stop the step loop; abort everything in flight (mutates)."""

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Submit ``request`` (mutates: enqueues) and stream its outputs until finished.
        Raises EngineError if the engine fails it; closing the iterator early aborts it."""
        ...

    async def abort(self, request_id: str) -> None:
        """Abort a request if it is still running and free what it holds (mutates)."""

    async def unpin(self, request_id: str) -> None:
        """Release the prefix pinned by ``request_id`` (mutates; no-op if none)."""

    # Optional: ``capacity() -> EngineCapacity`` (pure): the engine's batch and KV pool,
    # which the scheduler admits requests within; a backend without it admits up to
    # ``max_inflight``.

    # Optional: ``async reset_prefix_cache() -> bool``: forget every cached prefix no request
    # holds, before the next request (``POST /reset_prefix_cache`` with --dev-endpoints);
    # False when an engine kept its cache because requests hold its blocks (vLLM's
    # ``{"success": false}``), EngineError when one cannot reset (the remote pool). A
    # backend without it answers that endpoint 501.

    # Optional: ``check_constraint(sampling) -> None``, blocking (it may compile a grammar:
    # call it on a worker thread). Raises RequestRefused when ``sampling``'s structured
    # outputs cannot be served. A backend without it accepts every constraint here and
    # refuses in ``generate`` instead. See :func:`check_constraint`.

    def stats(self) -> EngineStats:
        """A snapshot of load and counters (pure)."""
        ...


def check_constraint(backend: Backend, sampling: SamplingParams) -> None:
    """Raise RequestRefused when ``backend`` cannot serve ``sampling``'s structured outputs
    (blocking: the engine compiles the grammar, cached, so call this on a worker thread).
    A backend without ``check_constraint`` accepts everything here."""
    check = getattr(backend, "check_constraint", None)
    if check is not None and sampling.structured_outputs is not None:
        check(sampling)
