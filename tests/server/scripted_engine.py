"""A deterministic engine for scheduler and early server tests (implements Backend).

It records every request in arrival order, answers with a text derived from the prompt (so
equal prompts give equal answers, whatever the request id), streams it in three pieces, and
models a prefix cache at segment granularity: a prompt's leading segments seen before count
as cached tokens. One token is one UTF-8 byte. ``hold`` keeps requests waiting until
``release``; ``fail_if`` injects an EngineError.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable

from eclectus.server.backend import (
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineStats,
    ModelCard,
    TokenizedPrompt,
)


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
        self._seen_prefixes: set[tuple[str, ...]] = set()
        self._stats = {"prompt": 0, "cached": 0, "generated": 0}

    @property
    def model(self) -> ModelCard:
        return ModelCard(name="scripted", context_window=4096)

    async def start(self) -> None:
        self.started += 1

    async def shutdown(self) -> None:
        self.stopped += 1

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
            prompt = "".join(request.segments)
            cached = self._cache(request.segments)
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
                    num_prompt_tokens=len(prompt.encode()),
                    num_cached_tokens=cached,
                    num_output_tokens=len(text.encode()) if last else 0,
                )
            self._stats["generated"] += len(text.encode())
        finally:
            self.running.discard(request.request_id)

    def _cache(self, segments: tuple[str, ...]) -> int:
        """Tokens of the longest leading run of segments seen before; remembers this prompt's
        prefixes (mutates)."""
        cached = 0
        for n in range(1, len(segments) + 1):
            if segments[:n] in self._seen_prefixes:
                cached = sum(len(s.encode()) for s in segments[:n])
            self._seen_prefixes.add(segments[:n])
        self._stats["prompt"] += sum(len(s.encode()) for s in segments)
        self._stats["cached"] += cached
        return cached

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def unpin(self, request_id: str) -> None:
        self.unpinned.append(request_id)

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode())

    def tokenize_prompt(self, segments: tuple[str, ...]) -> TokenizedPrompt:
        ids: list[int] = []
        ends: list[int] = []
        for segment in segments:
            ids += segment.encode()
            ends.append(len(ids))
        return TokenizedPrompt(tuple(ids), tuple(ends))

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
        text = "".join(request.segments).rsplit(self.marker, 1)[1].strip()
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
