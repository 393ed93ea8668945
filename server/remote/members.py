"""The engines a pool routes between: remote ones over HTTP, and the built-in engine.

Both stream one *attempt* at a request as :class:`Piece`s. An attempt's prompt is the
request's prompt plus whatever earlier attempts already generated (a failover continues, it
does not restart), and its ``max_tokens`` is what is left.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from eclectus.models.tokenizer import Tokenizer
from eclectus.protocol import SamplingParams
from eclectus.server.backend import Backend, EngineError, EngineRequest
from eclectus.server.front.prompt import Prompt
from eclectus.server.graph.admission import backend_capacity
from eclectus.server.remote.client import EngineClient
from eclectus.server.remote.dialect import Unenforceable, constraint_fields, supports
from eclectus.server.remote.errors import EngineDown, EngineRejected
from eclectus.server.remote.handshake import EngineInfo, handshake
from eclectus.server.remote.load import EngineLoad, parse_load

PRIORITY_SCALE = 1000  # vLLM's priority is an int: the scheduler's seconds, to milliseconds


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try at ``request``: ``prompt`` (the request's ids plus those generated so far),
    ``max_tokens`` left (None: until EOS or the context window), its number (0 first), and
    the text generated so far (for engines that take text prompts)."""

    request: EngineRequest
    prompt: Prompt
    max_tokens: int | None
    number: int
    generated_text: str = ""


@dataclass(frozen=True, slots=True)
class Piece:
    """Part of an attempt's stream: new text and its ids (None: the engine did not say),
    and, once known, the finish reason and the usage counts (None: not in this piece)."""

    text: str = ""
    token_ids: tuple[int, ...] | None = ()
    finish_reason: str | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None


class Member(Protocol):
    """One engine of the pool."""

    name: str

    def supports(self, sampling: SamplingParams) -> bool:
        """Whether the engine can honour ``sampling`` (its structured outputs) (pure)."""
        ...

    def stream(self, attempt: Attempt, window: int = 0) -> AsyncIterator[Piece]:
        """Run the attempt (mutates the engine); ``window`` is the pool's context window.
        EngineDown: fail over; EngineRejected: the request itself was refused."""
        ...

    async def probe(self) -> int | None:
        """Check the engine can serve (network); its context window. Raises EngineDown or
        RemoteStartError."""
        ...

    async def load(self) -> EngineLoad:
        """The engine's reported load (network; EngineDown if unreachable)."""
        ...

    async def unpin(self, request_id: str) -> None:
        """Release a prefix the engine pinned for ``request_id`` (mutates; may be a no-op)."""

    async def reset_prefix_cache(self) -> bool:
        """Empty the engine's prefix cache of what no request holds (mutates; network).
        False when the engine kept it; EngineRejected when it cannot reset."""
        ...

    async def aclose(self) -> None:
        """Release connections (mutates)."""


class RemoteMember:
    """A vLLM / SGLang / Eclectus engine at an OpenAI-compatible URL."""

    def __init__(self, client: EngineClient, tokenizer: Tokenizer) -> None:
        self.client = client
        self.name = client.url
        self.tokenizer = tokenizer
        self.info: EngineInfo | None = None  # set by probe
        self.received: list[dict[str, Any]] = []  # bodies sent, when record_bodies (tests)
        self.record_bodies = False
        # SGLang refuses an rid already in flight: ours are unique to this process
        self._rid_prefix = f"eclectus-{secrets.token_hex(4)}"

    async def probe(self) -> int | None:
        self.info = await handshake(self.client, self.tokenizer)
        return self.info.max_model_len

    def supports(self, sampling: SamplingParams) -> bool:
        """False for a constraint its dialect cannot express, or before its first handshake."""
        if sampling.structured_outputs is None:
            return True
        return self.info is not None and supports(self.info.dialect, sampling.structured_outputs)

    async def load(self) -> EngineLoad:
        text = await self.client.metrics()
        return EngineLoad() if text is None else parse_load(text)

    async def unpin(self, request_id: str) -> None:
        """No-op: vLLM and SGLang have no pins (their caches evict by LRU)."""

    async def reset_prefix_cache(self) -> bool:
        return await self.client.reset_prefix_cache()

    async def aclose(self) -> None:
        await self.client.aclose()

    def body(self, attempt: Attempt, window: int) -> dict[str, Any]:
        """The /v1/completions body for an attempt (pure). ``window``: the context window,
        for ``max_tokens`` None (vLLM's completions default would be 16). EngineRejected
        for a constraint the engine's dialect cannot express (never sent unconstrained)."""
        assert self.info is not None, "probe first"
        request, sampling = attempt.request, attempt.request.sampling
        max_tokens = attempt.max_tokens or window - len(attempt.prompt)
        prompt, add_special_tokens = self._prompt(attempt)
        body: dict[str, Any] = {
            "model": self.info.model_id,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            # a constrained reply ends where its grammar does, as on the built-in engine;
            # vLLM with ignore_eos would go on generating past the closed JSON
            "ignore_eos": sampling.ignore_eos and sampling.structured_outputs is None,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,  # vLLM >= 0.10.2; a failover continues from exact ids
        }
        optional = {
            "seed": sampling.seed,
            "stop": list(sampling.stop) or None,
            "stop_token_ids": list(sampling.stop_token_ids) or None,
            "cache_salt": request.tenant,  # tenants never share KV
            # vLLM's field (default true); sent only for a text prompt that must not get BOS
            "add_special_tokens": None if add_special_tokens else False,
            # vLLM's and SGLang's field (default true): off for a /v1 chat with tools
            "skip_special_tokens": None if sampling.skip_special_tokens else False,
            "priority": self._priority(request) if self.info.priority else None,
            # vLLM >= 0.11 (and Eclectus) batch this many tokens per chunk; older vLLM
            # ignores it; SGLang has no such request field (only its --stream-interval)
            "stream_interval": request.stream_interval
            if request.stream_interval > 1 and not self.info.sglang
            else None,
            "rid": f"{self._rid_prefix}-{request.request_id}-{attempt.number}"
            if self.info.sglang
            else None,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if sampling.structured_outputs is not None:
            try:
                body.update(constraint_fields(self.info.dialect, sampling.structured_outputs))
            except Unenforceable as exc:
                raise EngineRejected(f"{self.name}: {exc}", 400) from None
        return body

    def _priority(self, request: EngineRequest) -> int:
        """The scheduler's rank as the engine's integer priority: vLLM runs lower values
        first; SGLang (by default, without --schedule-low-priority-values-first) higher."""
        assert self.info is not None
        rank = round(request.priority * PRIORITY_SCALE)
        return -rank if self.info.sglang else rank

    def _prompt(self, attempt: Attempt) -> tuple[list[int] | str, bool]:
        """The ids, or for an engine that takes text: the prompt's ids decoded (special
        tokens kept as their text) followed by the text generated so far; and whether the
        engine is to add special tokens to that text (pure). A prompt that starts with BOS
        is sent without it and the engine adds its own; one without (a chat prompt) is sent
        with ``add_special_tokens`` false, so the engine's ids are the front's."""
        assert self.info is not None
        if self.info.token_prompts:
            return list(attempt.prompt.token_ids), True
        ids = list(attempt.request.prompt_token_ids)
        bos = self.tokenizer.bos_token_id
        starts_with_bos = bos is not None and ids[:1] == [bos]
        text = self.tokenizer.decode(ids[starts_with_bos:], skip_special_tokens=False)
        return text + attempt.generated_text, starts_with_bos or bos is None

    async def stream(self, attempt: Attempt, window: int = 0) -> AsyncIterator[Piece]:
        body = self.body(attempt, window)
        if self.record_bodies:
            self.received.append(body)
        chunks = self.client.stream_completion(body)
        async with contextlib.aclosing(chunks):  # closes the HTTP stream when we stop
            async for chunk in chunks:
                yield _piece(chunk)


def _piece(chunk: dict[str, Any]) -> Piece:
    """One SSE chunk as a Piece (pure); a usage-only chunk has no choices."""
    usage = chunk.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    choices = chunk.get("choices") or [{}]
    choice = choices[0]
    ids = choice.get("token_ids")
    return Piece(
        text=choice.get("text") or "",
        token_ids=None if ids is None and choice.get("text") else tuple(ids or ()),
        finish_reason=choice.get("finish_reason"),
        num_prompt_tokens=usage.get("prompt_tokens"),
        num_cached_tokens=details.get("cached_tokens"),
    )


class LocalMember:
    """The built-in engine (``--engine builtin``) as one member of the pool. It runs in this
    process, so it is never marked down; its failures fail the request."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = "builtin"

    def supports(self, sampling: SamplingParams) -> bool:
        return True  # the built-in engine takes every SamplingParams

    async def probe(self) -> int | None:
        await self.backend.start()
        return self.backend.max_model_len

    async def load(self) -> EngineLoad:
        stats = self.backend.stats()
        total = stats.num_total_blocks
        usage = 1.0 - stats.num_free_blocks / total if total else None
        kv_tokens = backend_capacity(self.backend).kv_tokens
        return EngineLoad(
            stats.num_running, stats.num_waiting, usage, kv_tokens, stats.num_preemptions
        )

    async def unpin(self, request_id: str) -> None:
        await self.backend.unpin(request_id)

    async def reset_prefix_cache(self) -> bool:
        reset = getattr(self.backend, "reset_prefix_cache", None)  # optional in Backend
        if reset is None:
            raise EngineRejected(f"{self.name}: this engine cannot reset its prefix cache", 501)
        return bool(await reset())

    async def aclose(self) -> None:
        await self.backend.shutdown()

    async def stream(self, attempt: Attempt, window: int = 0) -> AsyncIterator[Piece]:
        request = attempt.request
        first = attempt.number == 0
        local = EngineRequest(
            # a retry gets its own id: the engine may still hold the first one's state
            request_id=request.request_id if first else f"{request.request_id}#{attempt.number}",
            prompt_token_ids=attempt.prompt.token_ids,
            sampling=request.sampling.model_copy(update={"max_tokens": attempt.max_tokens}),
            priority=request.priority,
            group=request.group,
            tenant=request.tenant,
            prefix_ends=attempt.prompt.prefix_ends,
            pin_prefix_tokens=request.pin_prefix_tokens if first else 0,
            background=request.background,
        )
        outputs = self.backend.generate(local)
        try:
            async with contextlib.aclosing(outputs):  # type: ignore[type-var]
                async for out in outputs:
                    yield Piece(
                        text=out.text,
                        token_ids=out.token_ids,
                        finish_reason=out.finish_reason if out.finished else None,
                        num_prompt_tokens=out.num_prompt_tokens if out.finished else None,
                        num_cached_tokens=out.num_cached_tokens if out.finished else None,
                    )
        except EngineError as exc:
            raise EngineRejected(f"builtin: {exc}", 500) from None


__all__ = ["Attempt", "EngineDown", "LocalMember", "Member", "Piece", "RemoteMember"]
