"""A deterministic engine for scheduler and early server tests (implements Backend).

It records every request in arrival order, answers with a text derived from the prompt's
text (its ids decoded with the tiny tokenizer, which the servers and schedulers of these tests
tokenize with: :data:`FRONT`; equal prompts give equal answers, whatever the request id),
streams it in three pieces, and models a prefix cache at seam granularity: a prompt's longest
prefix ending at one of its ``prefix_ends`` seen before counts as cached. An output token is
one UTF-8 byte of the answer. ``hold`` keeps requests waiting until ``release``; ``fail_if``
injects an EngineError.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable

from eclectus.server.backend import EngineError, EngineOutput, EngineRequest, EngineStats
from eclectus.server.front.prompt import Front

FRONT = Front.load("tiny")  # the tokenizer the scripted engine's prompts come from


def prompt_text(request: EngineRequest) -> str:
    """The text of a request's prompt: its ids decoded (special tokens skipped) (pure)."""
    return FRONT.tokenizer.decode(request.prompt_token_ids)


def scripted_text(prompt: str, max_tokens: int | None) -> str:
    """The answer the scripted engine gives to ``prompt`` (pure). ``max_tokens`` None: the
    whole answer, as if it ended with EOS."""
    return f" r{zlib.crc32(prompt.encode()):08x}"[:max_tokens]


class ScriptedEngine:
    """Backend for tests. Public lists are the record tests assert on."""

    def __init__(
        self,
        *,
        hold: bool = False,
        fail_if: Callable[[EngineRequest], bool] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.requests: list[EngineRequest] = []
        self.aborted: list[str] = []
        self.unpinned: list[str] = []
        self.running: set[str] = set()
        self.hold = hold
        self.fail_if = fail_if
        self.delay_s = delay_s
        self.started = 0
        self.stopped = 0
        self._gate = asyncio.Event() if hold else None
        self._seen_prefixes: set[tuple[int, ...]] = set()
        self._stats = {"prompt": 0, "cached": 0, "generated": 0}

    @property
    def max_model_len(self) -> int:
        return 4096

    async def start(self) -> None:
        self.started += 1

    async def shutdown(self) -> None:
        self.stopped += 1

    def pause(self) -> None:
        """Hold the requests that arrive from now on until :meth:`release` (mutates)."""
        self.hold = True
        self._gate = asyncio.Event()

    def release(self) -> None:
        """Let held requests (and all later ones) run (mutates)."""
        self.hold = False
        if self._gate is not None:
            self._gate.set()

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.requests.append(request)
        self.running.add(request.request_id)
        try:
            if self.hold and self._gate is not None:
                await self._gate.wait()
            if self.fail_if is not None and self.fail_if(request):
                raise EngineError(f"injected failure for {request.request_id}")
            prompt = prompt_text(request)
            cached = self._cache(request)
            text = scripted_text(prompt, request.sampling.max_tokens)
            pieces = [text[: len(text) // 3], text[len(text) // 3 : 2 * len(text) // 3]]
            pieces.append(text[2 * len(text) // 3 :])
            for i, piece in enumerate(pieces):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                else:
                    await asyncio.sleep(0)
                last = i == len(pieces) - 1
                yield EngineOutput(
                    request_id=request.request_id,
                    text=piece,
                    token_ids=tuple(piece.encode()),
                    finished=last,
                    finish_reason="length" if last else None,
                    num_prompt_tokens=len(request.prompt_token_ids),
                    num_cached_tokens=cached,
                    num_output_tokens=len(text.encode()) if last else 0,
                )
            self._stats["generated"] += len(text.encode())
        finally:
            self.running.discard(request.request_id)

    def _cache(self, request: EngineRequest) -> int:
        """Tokens of the longest prefix ending at a seam seen before; remembers this
        prompt's seam prefixes (mutates)."""
        ids = request.prompt_token_ids
        cached = 0
        for end in sorted(set(request.prefix_ends or (len(ids),))):
            if ids[:end] in self._seen_prefixes:
                cached = end
            self._seen_prefixes.add(ids[:end])
        self._stats["prompt"] += len(ids)
        self._stats["cached"] += cached
        return cached

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def unpin(self, request_id: str) -> None:
        self.unpinned.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.running),
            prompt_tokens=self._stats["prompt"],
            prefill_tokens=self._stats["prompt"] - self._stats["cached"],
            cache_hit_tokens=self._stats["cached"],
            generated_tokens=self._stats["generated"],
        )


class MarkedReplyEngine(ScriptedEngine):
    """The scripted engine, but a call whose structured output sets ``kind`` (a field of
    ``StructuredOutputs``: "choice", "json_schema", ...) answers, in one piece, the prompt's
    text after its last ``marker``: a scripted constrained reply, valid or not."""

    kind = ""
    marker = ""

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        constraint = request.sampling.structured_outputs
        if constraint is None or getattr(constraint, self.kind) is None:
            async for output in super().generate(request):
                yield output
            return
        self.requests.append(request)
        text = prompt_text(request).rsplit(self.marker, 1)[1].strip()
        yield EngineOutput(
            request_id=request.request_id,
            text=text,
            token_ids=tuple(text.encode()),
            finished=True,
            finish_reason="stop",
            num_prompt_tokens=1,
            num_cached_tokens=0,
            num_output_tokens=len(text.encode()),
        )
