"""RemoteBackend: the scheduler's Backend over a pool of engines (vLLM, SGLang, Eclectus,
and optionally the built-in engine).

Failover without duplicates. Text reaches the graph as the engine produces it (streamed
deltas), so an attempt that fails after yielding text cannot be taken back. A failover
therefore *continues* the request instead of restarting it: the next engine gets the
original prompt's ids followed by the ids generated so far, and ``max_tokens`` minus their
count, so the stream goes on where it stopped and nothing is yielded twice. Under greedy
decoding the result is the text one uninterrupted engine gives (the continuation's prompt is
exactly the sequence that engine would have decoded from); a sampled request continues with
a fresh random stream. Ids come from the engine (``return_token_ids``, vLLM >= 0.10.2); an
engine that does not return them is continued from the local tokenizer's ids of the text so
far. A stop string that straddles the failover point is not caught (each engine sees only
its own text); ``stop_token_ids`` and EOS are.

A down engine is waited for, within bounds. A failed stream marks its engine down and probes
it at once (pool.py); an attempt that finds no engine healthy waits up to the pool's
``max_down_wait_s`` for one to return, then fails the request with EngineUnavailableError
(the reasons and the wait in its message). A request makes at most one attempt more than
there are engines, so an engine that keeps passing its probe and dropping streams fails it
too, and no request waits longer than that many bounds for engines to return.

Structured outputs travel in each engine's own request fields (dialect.py) and go only to
engines that can enforce them. A constrained call that fails after streaming text cannot be
continued elsewhere (the next engine's grammar would start over mid-structure): it fails with
``engine_error``; one that failed before any text fails over as usual.

Preemption uses the same continuation (preemption.py): a background attempt the pool pauses
for a chat stops at once (its stream is closed, even mid-wait), waits for the engine to admit
background work again, and continues where it stopped; pauses do not count as failed attempts.

What the graph knows, the engines get: the scheduler's rank as ``priority`` (engines that
accept one), the tenant as ``cache_salt``, whether anyone watches the call's tokens as
``stream_interval`` (a call nobody watches streams in chunks of several tokens; a paused or
failed-over attempt's tokens not yet streamed are generated again by the continuation), and
the prompt's seams (``EngineRequest.prefix_ends``) for routing (pool.py, routing.py).

Prompts arrive as ids (the server's front tokenized them as the engines' own tokenizer would,
checked at the handshake) and leave as ids; the local tokenizer only decodes after a
failover (continuation.py) and re-encodes the text generated so far for an engine that does
not return ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from eclectus.models.tokenizer import Tokenizer
from eclectus.server.backend import (
    EngineCapacity,
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineStats,
    EngineUnavailableError,
)
from eclectus.server.front.prompt import Prompt
from eclectus.server.remote.continuation import LocalText
from eclectus.server.remote.errors import EngineDown, EngineRejected, RemoteStartError
from eclectus.server.remote.members import Attempt, Piece
from eclectus.server.remote.pool import EnginePool, Placement
from eclectus.server.remote.preemption import until_paused

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Progress:
    """One request's output so far, across attempts."""

    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    exact_ids: bool = True  # every id came from an engine (else: re-tokenize the text)
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    local: LocalText | None = None  # after a failover: text decoded here from the ids


class RemoteBackend:
    """Implements ``eclectus.server.backend.Backend`` over an :class:`EnginePool`. The
    tokenizer is the local model directory's (no weights are loaded).
    ``window``: the context window to assume when no engine reports one."""

    def __init__(
        self, pool: EnginePool, tokenizer: Tokenizer, *, window: int | None = None
    ) -> None:
        self.pool = pool
        self.tokenizer = tokenizer
        self.window = window
        self.num_failovers = 0
        self.num_preemptions = 0
        self.num_generated_tokens = 0
        self.num_prompt_tokens = 0
        self.num_cached_tokens = 0
        self.num_pieces = 0  # stream chunks received from the engines (stream_interval)
        self._max_model_len: int | None = None
        self._started = False

    @property
    def max_model_len(self) -> int:
        """The pool's context window: the smallest an engine reports, or ``window``
        (pure; known once :meth:`start` has run)."""
        if self._max_model_len is None:
            raise RuntimeError("RemoteBackend.max_model_len is known once start() has run")
        return self._max_model_len

    async def start(self) -> None:
        """Handshake every engine and start probing (mutates; idempotent). Raises
        RemoteStartError when the pool cannot serve."""
        if self._started:
            return
        try:
            await self.pool.start()
            windows = [w for w in (self.pool.window, self.window) if w is not None]
            if not windows:
                raise RemoteStartError(
                    "no engine reports its max_model_len in /v1/models: pass --max-model-len"
                )
        except BaseException:  # a pool that will not serve holds no connections open
            await self.pool.close()
            raise
        self._started = True
        self._max_model_len = min(windows)

    async def shutdown(self) -> None:
        """Stop probing and close every engine's connections (mutates; idempotent)."""
        await self.pool.close()

    # -- requests ---------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Stream ``request`` from the engine the pool picks, failing over as the module
        says (mutates: engine state). EngineUnavailableError when no engine is left,
        EngineError when an engine refuses the request itself."""
        prompt = Prompt(request.prompt_token_ids, request.prefix_ends)
        self._check_constraint(request)
        progress = _Progress()
        max_attempts = len(self.pool.engines) + 1
        number = num_failed = 0
        while num_failed < max_attempts:
            attempt = self._attempt(request, prompt, progress, number)
            if attempt is None and number == 0:
                raise EngineError(
                    f"prompt of {len(prompt)} tokens leaves no room in the context window "
                    f"of {self.max_model_len}"
                )
            if attempt is None:  # the budget ran out exactly at the failover or pause
                progress.finish_reason = "length"
                break
            number += 1
            placement = await self._acquire(request, attempt)
            try:
                stream = placement.engine.member.stream(attempt, self.max_model_len)
                pieces = (
                    stream if placement.pause is None else until_paused(stream, placement.pause)
                )
                # closing the stream aborts the request (the pieces first: they may be waiting)
                async with contextlib.aclosing(stream), contextlib.aclosing(pieces):
                    async for piece in pieces:
                        self.num_pieces += 1
                        output = self._absorb(request.request_id, piece, progress)
                        if output is not None:
                            yield output
                        if progress.finish_reason == "stop" and progress.local is not None:
                            break  # the local text met a stop string
                if not placement.preempted or progress.finish_reason is not None:
                    break
                self.num_preemptions += 1
                log.debug("paused %s after %d tokens", request.request_id, len(progress.token_ids))
                self._go_local(request, progress)
            except EngineDown as exc:
                if progress.finish_reason is not None:
                    break  # it failed after saying it was done: nothing is missing
                num_failed += 1
                self.pool.stream_failed(placement.engine, str(exc))
                if request.sampling.structured_outputs is not None and progress.token_ids:
                    raise EngineError(
                        f"{request.request_id}: {exc}; a constrained output cannot continue "
                        "on another engine after it has begun"
                    ) from None
                self.num_failovers += 1
                log.warning("failing over %s: %s", request.request_id, exc)
                self._go_local(request, progress)
            except EngineRejected as exc:
                raise EngineError(str(exc)) from None
            finally:
                self.pool.release(placement)
        else:
            raise EngineUnavailableError(
                f"{request.request_id} failed on {max_attempts} attempts ({self._down_reasons()})"
            )
        if progress.local is not None:
            text, stopped = progress.local.flush()
            if stopped:
                progress.finish_reason = "stop"
            if text:
                progress.text.append(text)
                yield EngineOutput(request.request_id, text, ())
        yield self._final(request.request_id, prompt, progress)

    async def _acquire(self, request: EngineRequest, attempt: Attempt) -> Placement:
        """A slot for ``attempt`` (mutates the pool); EngineUnavailableError when no engine
        came back within the pool's ``max_down_wait_s``, with the reasons and the wait."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        placement = await self.pool.acquire(request, attempt.prompt)
        if placement is None:
            waited = loop.time() - start
            raise EngineUnavailableError(
                f"no engine is available for {request.request_id} after waiting "
                f"{waited:.1f} s for one to come back ({self._down_reasons()})"
            )
        return placement

    def _check_constraint(self, request: EngineRequest) -> None:
        """EngineError when no engine of the pool can enforce the request's structured
        outputs (pure): it is refused, never decoded unconstrained."""
        constraint = request.sampling.structured_outputs
        engines = self.pool.engines
        if constraint is None or any(e.member.supports(request.sampling) for e in engines):
            return
        dialects = ", ".join(
            f"{e.member.name}: {getattr(getattr(e.member, 'info', None), 'dialect', 'unknown')}"
            for e in self.pool.engines
        )
        raise EngineError(
            f"no engine of the pool can enforce structured outputs of kind "
            f"{constraint.kind!r} ({dialects}; docs/engines.md)"
        )

    def _go_local(self, request: EngineRequest, progress: _Progress) -> None:
        """From the first failover on, decode the text here from all ids (continuation.py)
        when the ids are exact (mutates ``progress``)."""
        if progress.local is None and progress.exact_ids:
            progress.local = LocalText.resume(
                self.tokenizer, progress.token_ids, "".join(progress.text), request.sampling.stop
            )

    def _attempt(
        self, request: EngineRequest, prompt: Prompt, progress: _Progress, number: int
    ) -> Attempt | None:
        """The next try (pure): the prompt continued by what is generated so far; None when
        nothing is left to generate."""
        generated = self._generated_ids(progress)
        max_tokens = request.sampling.max_tokens
        if max_tokens is not None:
            max_tokens -= len(generated)
        window_left = self.max_model_len - len(prompt) - len(generated)
        if (max_tokens is not None and max_tokens <= 0) or window_left <= 0:
            return None
        if generated:
            ends = (*prompt.prefix_ends, len(prompt) + len(generated))
            prompt = Prompt((*prompt.token_ids, *generated), ends)
        return Attempt(request, prompt, max_tokens, number, "".join(progress.text))

    def _generated_ids(self, progress: _Progress) -> list[int]:
        if progress.exact_ids:
            return progress.token_ids
        return self.tokenizer.encode("".join(progress.text), add_special_tokens=False)

    def _absorb(self, request_id: str, piece: Piece, progress: _Progress) -> EngineOutput | None:
        """Fold a piece into the progress (mutates it); the output to yield, if any."""
        if piece.finish_reason is not None:
            progress.finish_reason = piece.finish_reason
        if piece.num_cached_tokens is not None:
            progress.num_cached_tokens += piece.num_cached_tokens
        if piece.token_ids is None:
            progress.exact_ids = False
        ids = piece.token_ids or ()
        progress.token_ids += ids
        text = piece.text
        if progress.local is not None:
            text, stopped = progress.local.feed(ids)
            if stopped:
                progress.finish_reason = "stop"
        if not text and not ids:
            return None
        progress.text.append(text)
        return EngineOutput(request_id, text, tuple(ids))

    def _final(self, request_id: str, prompt: Prompt, progress: _Progress) -> EngineOutput:
        num_output = len(self._generated_ids(progress))
        self.num_prompt_tokens += len(prompt)
        self.num_generated_tokens += num_output
        self.num_cached_tokens += progress.num_cached_tokens
        return EngineOutput(
            request_id,
            "",
            (),
            finished=True,
            finish_reason=progress.finish_reason or "stop",
            num_prompt_tokens=len(prompt),
            num_cached_tokens=progress.num_cached_tokens,
            num_output_tokens=num_output,
        )

    def _down_reasons(self) -> str:
        down = [f"{e.member.name}: {e.down_reason}" for e in self.pool.engines if not e.healthy]
        return "; ".join(down) or "every engine is busy"

    async def abort(self, request_id: str) -> None:
        """No-op: closing the generate() stream closes the HTTP stream, which aborts the
        request in vLLM and SGLang (the runner always closes it first)."""

    async def unpin(self, request_id: str) -> None:
        """Forget the prefix ``request_id`` pinned for routing (mutates)."""
        await self.pool.unpin(request_id)

    async def reset_prefix_cache(self) -> bool:
        """Empty every healthy engine's prefix cache (the front's ``POST
        /reset_prefix_cache``); False when one kept it because requests hold its blocks.
        EngineError naming each engine that cannot reset."""
        all_reset, failures = await self.pool.reset_prefix_cache()
        if failures:
            raise EngineError("the prefix cache was not reset on " + "; ".join(failures))
        return all_reset

    def capacity(self) -> EngineCapacity:
        """The healthy engines' batches (our cap per engine) and KV caches (their /metrics),
        summed, for the scheduler's admission (pure). KV unknown while any engine has not
        said. While none is healthy, every engine's caps: calls admitted then wait in the
        pool for one to return (``max_down_wait_s``), and an unbounded cap would let the
        whole queue in at once, out of the scheduler's order."""
        healthy = [e for e in self.pool.engines if e.healthy] or self.pool.engines
        kv = [e.load.kv_tokens for e in healthy]
        shared = {e.load.shared_block_size for e in healthy}
        return EngineCapacity(
            num_engines=max(len(healthy), 1),
            max_seqs=sum(e.max_inflight for e in healthy) or None,
            kv_tokens=sum(k for k in kv if k is not None) if kv and None not in kv else None,
            # sharing is counted only where every engine shares at one block size
            shared_block_size=shared.pop() if len(shared) == 1 else None,
        )

    def stats(self) -> EngineStats:
        """Load summed over healthy engines, from their /metrics where they serve it, else
        our in-flight counts; each engine's health and in-flight count, failovers and
        routing decisions in ``extra`` (pure)."""
        running = waiting = preemptions = 0
        extra: dict[str, float] = {
            "failovers": float(self.num_failovers),
            "preemptions": float(self.num_preemptions),
            "pieces": float(self.num_pieces),
        }
        for e in self.pool.engines:
            extra[f"engine{e.index}_healthy"] = float(e.healthy)
            extra[f"engine{e.index}_inflight"] = float(e.num_inflight)
            if e.events is not None:  # its KV events: live, blocks held, gaps, losses...
                for key, value in e.events.stats().items():
                    extra[f"engine{e.index}_kv_events_{key}"] = float(value)
            if not e.healthy:
                continue  # its last load is stale
            running += e.load.num_running if e.load.num_running is not None else e.num_inflight
            waiting += e.load.num_waiting or 0
            preemptions += e.load.num_preemptions or 0
        for reason, count in self.pool.decisions.items():
            extra[f"routed_{reason}"] = float(count)
        return EngineStats(
            num_running=running,
            num_waiting=waiting,
            prompt_tokens=self.num_prompt_tokens,
            cache_hit_tokens=self.num_cached_tokens,
            generated_tokens=self.num_generated_tokens,
            num_preemptions=preemptions,  # the engines' own (pauses: extra["preemptions"])
            extra=extra,
        )
