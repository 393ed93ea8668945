"""What an engine is asked and what it answers: the engine's own request, output and stats
types, as vLLM's ``EngineCoreRequest`` lives with its engine.

Torch-free and import-free above the engine, so the server's ``Backend`` contract
(:mod:`eclectus.server.backend`), the remote pool and the engine core's pipe all use these
types without loading the engine. A request carries token ids only: the server's front
(:mod:`eclectus.server.front.prompt`) turned its text into ids once, as a stock server does, and
nothing downstream tokenizes again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eclectus.protocol import ErrorCode, SamplingParams


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation: a prompt's ids and how to sample.

    ``prompt_token_ids``: the model tokenizer's ids of the flat prompt text (BOS included
    when the prompt takes special tokens), never empty. ``prefix_ends``: where a prefix this
    prompt shares with others may end, as token counts (at each seam between the prompt's
    segments, the ids lying wholly before it, and the prompt's length); the remote pool
    routes by them, the built-in engine's prefix cache needs none (it matches full blocks).
    ``pin_prefix_tokens``: how many leading ids the graph still needs later; the engine
    keeps their KV pinned until :meth:`Backend.unpin` with the same request id (0: no pin).
    ``priority``: lower runs first (the engine admits waiting requests in (priority,
    arrival) order). ``background``: throughput work nobody waits on; while foreground
    requests are in the engine, it computes at most ``EngineConfig.max_background_seqs`` of
    these per step. ``group``: requests the scheduler dispatched together (siblings);
    ``tenant`` salts the prefix cache so tenants never share KV.
    ``stream_interval``: how many new tokens the engine may batch into one output (1: every
    token; the first and the final outputs always come at once). The scheduler sets it above
    1 for a call nobody watches token by token; a remote engine gets it as vLLM's
    ``stream_interval`` (it saves a detokenize, a JSON chunk and its parse per token there);
    the built-in engine ignores it (in-process, an output costs no serialization).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    priority: float = 0.0
    group: str | None = None
    tenant: str | None = None
    prefix_ends: tuple[int, ...] = ()
    pin_prefix_tokens: int = 0
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


@dataclass(frozen=True, slots=True)
class EngineCapacity:
    """What the engines behind a backend hold at once, as far as the backend knows (None:
    it does not say); the scheduler admits requests within it (server/graph/admission.py)."""

    num_engines: int = 1
    max_seqs: int | None = None  # sequences all of them run at once (their batches summed)
    kv_tokens: int | None = None  # their KV caches, in tokens, summed
    # the block size at which every engine shares a prompt's leading full blocks between the
    # requests it runs at once (prefix caching on); None: no sharing, or not said
    shared_block_size: int | None = None


class EngineError(RuntimeError):
    """The engine failed a request; the message says why. ``code``: the wire error code the
    failed call's gets answer with."""

    code: ErrorCode = "engine_error"


class RequestRefused(EngineError):
    """The engine refuses the request itself (a structured-outputs constraint it cannot
    compile, a ``max_tokens`` too small for any valid output): the client's mistake, answered
    as ``bad_request``; retrying the same request will not help."""

    code: ErrorCode = "bad_request"


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """A request ended in failure, as a value that crosses threads and the engine core's
    pipe. ``refused``: its constraint was refused (the client's mistake, RequestRefused);
    else the engine failed it (EngineError)."""

    request_id: str
    message: str
    refused: bool = False

    def error(self) -> EngineError:
        """The exception its request's stream raises (pure)."""
        return (RequestRefused if self.refused else EngineError)(self.message)
