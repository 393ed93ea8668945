"""The one small async interface through which the scheduler reaches an engine.

The built-in engine (``eclectus.server.engine.AsyncEngine``) implements it; scheduler unit
tests use a scripted engine. Nothing here imports torch or the engine: the types a request
and a model are described with (``SamplingParams``, ``ModelCard``) come from the neutral
contract package :mod:`eclectus.protocol`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from eclectus.protocol import ErrorCode, ModelCard, SamplingParams


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    """A prompt's token ids (BOS included where the tokenizer adds one) and the offset where
    each of its segments ends."""

    token_ids: tuple[int, ...]
    segment_ends: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation: a prompt given as segments, and how to sample.

    The prompt is the concatenation of ``segments``; each segment is tokenized on its own and
    the token ids are concatenated (after a BOS token where the tokenizer adds one), so a
    segment boundary is an exact KV reuse point. ``tokens``: those ids, when the caller has
    already computed them with :meth:`Backend.tokenize_prompt` (the server does, off its
    event loop when the prompt is long, so the engine's step thread does not tokenize); None:
    the engine tokenizes.
    ``priority``: lower runs first (the engine admits waiting requests in (priority, arrival)
    order). ``background``: throughput work nobody waits on; while foreground requests are in
    the engine, it computes at most ``EngineConfig.max_background_seqs`` of these per step.
    ``group``: requests the scheduler dispatched together (siblings); ``tenant`` salts the
    prefix cache so tenants never share KV. ``pin_prefix_segments``: how many leading
    segments the graph still needs later; the engine keeps their KV pinned until
    :meth:`Backend.unpin` with the same request id.
    ``stream_interval``: how many new tokens the engine may batch into one output (1: every
    token; the first and the final outputs always come at once). The scheduler sets it above
    1 for a call nobody watches token by token; a remote engine gets it as vLLM's
    ``stream_interval`` (it saves a detokenize, a JSON chunk and its parse per token there);
    the built-in engine ignores it (in-process, an output costs no serialization).
    """

    request_id: str
    segments: tuple[str, ...]
    sampling: SamplingParams
    priority: float = 0.0
    group: str | None = None
    tenant: str | None = None
    pin_prefix_segments: int = 0
    tokens: TokenizedPrompt | None = None
    background: bool = False
    stream_interval: int = 1


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """A step's news about one request: text and tokens new since the previous output.
    The last output of a request has ``finished`` set and a ``finish_reason``
    ("stop", "length", "abort")."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot for /metrics and for the scheduler's load decisions."""

    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    num_cached_blocks: int = 0
    prompt_tokens: int = 0  # prompt tokens of all requests so far
    prefill_tokens: int = 0  # prompt tokens actually computed (cache misses, recompute)
    cache_hit_tokens: int = 0  # prompt tokens served from the prefix cache
    generated_tokens: int = 0
    num_preemptions: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class EngineError(RuntimeError):
    """The engine failed a request; the message says why. ``code``: the wire error code the
    failed call's gets answer with."""

    code: ErrorCode = "engine_error"


class RequestRefused(EngineError):
    """The engine refuses the request itself (a structured-outputs constraint it cannot
    compile, a ``max_tokens`` too small for any valid output): the client's mistake, answered
    as ``bad_request``; retrying the same request will not help."""

    code: ErrorCode = "bad_request"


class EngineUnavailableError(EngineError):
    """No engine can take the request (every remote engine is down); retrying later may
    succeed."""

    code: ErrorCode = "engine_unavailable"


class Backend(Protocol):
    """What the scheduler needs from an engine. Methods that change state say so."""

    @property
    def model(self) -> ModelCard: ...

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

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` as the engine tokenizes one segment that is not the first
        (no BOS; pure)."""
        ...

    # Optional: ``check_constraint(sampling) -> None``, blocking (it may compile a grammar:
    # call it on a worker thread). Raises RequestRefused when ``sampling``'s structured
    # outputs cannot be served. A backend without it accepts every constraint here and
    # refuses in ``generate`` instead. See :func:`check_constraint`.

    def tokenize_prompt(self, segments: tuple[str, ...]) -> TokenizedPrompt:
        """The ids the engine would compute for a request with these ``segments`` (pure)."""
        ...

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
