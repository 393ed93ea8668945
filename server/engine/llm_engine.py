"""The synchronous engine core: add requests, step, abort. One step = schedule, run,
postprocess. Not thread-safe: exactly one thread drives it (see async_engine)."""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from eclectus.models.tokenizer import Tokenizer
from eclectus.protocol.kv_events import KVEventBatch
from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.block_manager import BlockManager
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.model import load_model
from eclectus.server.engine.model_runner import ModelRunner
from eclectus.server.engine.output_processor import OutputState
from eclectus.server.engine.request import EngineOutput, EngineRequest, EngineStats
from eclectus.server.engine.sampler import Sampler
from eclectus.server.engine.scheduler import ScheduledSeq, SchedulerOutput, StepScheduler
from eclectus.server.engine.sequence import FinishReason, Sequence

if TYPE_CHECKING:  # xgrammar is imported on the first constrained request
    from eclectus.server.engine.kv_publisher import KVEventPublisher
    from eclectus.server.engine.structured import GrammarBackend, GrammarState


def default_num_threads() -> int:
    """Torch threads on CPU: all cores but one, which stays with the event loop, the
    tokenizer and the server (an oversubscribed core stalls every intra-op barrier)."""
    return max(1, (os.cpu_count() or 2) - 1)


class StepFailed(RuntimeError):
    """A step raised; ``request_ids`` were in it and have been failed and freed."""

    def __init__(
        self, request_ids: list[str], cause: BaseException, outputs: list[EngineOutput]
    ) -> None:
        super().__init__(f"engine step failed ({type(cause).__name__}: {cause})")
        self.request_ids = request_ids
        self.cause = cause
        self.outputs = outputs  # outputs of other requests produced before the failure


@dataclass(slots=True)
class Counters:
    """Monotonic counters since start: each token counter is reported under its name in
    :class:`EngineStats`, the step count in its ``extra``."""

    prompt_tokens: int = 0  # prompt tokens of all requests added
    prefill_tokens: int = 0  # known tokens actually computed (misses and recomputes)
    cache_hit_tokens: int = 0  # prompt tokens served from the prefix cache
    generated_tokens: int = 0
    num_steps: int = 0


class LLMEngine:
    """Owns the model runner, block manager, scheduler, sampler and per-request state."""

    def __init__(self, config: EngineConfig) -> None:
        from eclectus.models.presets import resolve_model_dir

        if config.device == "cpu":
            torch.set_num_threads(config.num_threads or default_num_threads())
        self.config = config
        model_dir = resolve_model_dir(config.model)
        model, self.model_config = load_model(model_dir, config.dtype, config.device)
        self.tokenizer = Tokenizer.from_dir(model_dir)
        self.runner = ModelRunner(model, self.model_config, config)
        self.block_manager = BlockManager(
            self.runner.num_blocks,
            config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            enable_kv_events=config.kv_events is not None and config.kv_events.enabled,
        )
        self.kv_publisher: KVEventPublisher | None = None
        if self.block_manager.kv_events is not None:
            from eclectus.server.engine.kv_publisher import KVEventPublisher

            assert config.kv_events is not None
            self.kv_publisher = KVEventPublisher(config.kv_events)
        self.scheduler = StepScheduler(
            self.block_manager,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            max_background_seqs=config.max_background_seqs,
        )
        self.sampler = Sampler(config.seed, config.device)
        # the most tokens one request can hold: the window, and the whole KV pool (a prompt
        # the pool cannot hold even alone is refused at add, never "finished" empty)
        limit = self.model_config.max_model_len
        pool = self.runner.num_blocks * config.block_size
        self.max_model_len = min(config.max_model_len or limit, limit, pool)
        self.counters = Counters()
        # why requests finished with "error" alone (their own parameters broke sampling or
        # detokenizing); the caller takes each with pop_failure when it sees the output
        self.failures: dict[str, str] = {}
        self._seqs: dict[str, Sequence] = {}
        self._states: dict[str, OutputState] = {}
        self._grammars: dict[str, GrammarState] = {}  # constrained requests' matchers
        self._grammar_backend: GrammarBackend | None = None
        self._grammar_lock = threading.Lock()  # prepare_grammar runs on worker threads
        self._arrivals = itertools.count()

    # ---- requests -------------------------------------------------------------------------

    def add_request(self, request: EngineRequest, grammar: GrammarState | None = None) -> None:
        """Queue ``request`` (its ids, as the front computed them) (mutates). ``grammar``:
        its matcher from :meth:`prepare_grammar`, when the caller built it already (off the
        step thread); None: built here. Raises ValueError on a bad request."""
        self.add_tokens(
            request.request_id,
            request.prompt_token_ids,  # copied into the sequence once, by _new_sequence
            request.sampling,
            priority=request.priority,
            background=request.background,
            tenant=request.tenant,
            pin_prefix_tokens=request.pin_prefix_tokens,
            grammar=grammar,
        )

    def prepare_grammar(self, sampling: SamplingParams) -> GrammarState | None:
        """A fresh matcher for a request with ``sampling``, or None when it is free: the
        constraint compiled (cached) and the budget checked, the slow part of admitting a
        constrained request. Safe on any thread (touches only the grammar backend, which
        locks its cache), so the async engine calls it on a worker thread and the step
        thread never compiles. Raises GrammarError (a ValueError) naming what is wrong."""
        if sampling.structured_outputs is None:
            return None
        budget = sampling.max_tokens if self.config.budget_guarantee else None
        return self.grammar_backend.new_state(sampling.structured_outputs, budget)

    def add_tokens(
        self,
        request_id: str,
        token_ids: list[int] | tuple[int, ...],
        sampling: SamplingParams,
        *,
        priority: float = 0.0,
        background: bool = False,
        tenant: str | None = None,
        pin_prefix_tokens: int = 0,
        grammar: GrammarState | None = None,
    ) -> None:
        """Queue a request given as token ids (mutates); ``grammar`` as :meth:`add_request`.
        Raises ValueError on a bad one."""
        seq = self._new_sequence(
            request_id,
            token_ids,
            sampling,
            grammar,
            priority=priority,
            background=background,
            tenant=tenant,
            pin_prefix_tokens=pin_prefix_tokens,
        )
        self.scheduler.add(seq)

    def _new_sequence(
        self,
        request_id: str,
        token_ids: list[int] | tuple[int, ...],
        sampling: SamplingParams,
        grammar: GrammarState | None,
        **fields: Any,
    ) -> Sequence:
        """Validate and register a request's sequence and output state (mutates)."""
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt of {len(token_ids)} tokens leaves no room for an output token: a "
                f"request holds at most {self.max_model_len} (context window and KV pool)"
            )
        if grammar is None:  # GrammarError (a ValueError) if the constraint is bad
            grammar = self.prepare_grammar(sampling)
        seq = Sequence(
            request_id,
            list(token_ids),
            sampling,
            next(self._arrivals),
            max_total_tokens=self.max_model_len,
            **fields,
        )
        if sampling.seed is not None and not sampling.greedy:
            seq.generator = self.sampler.new_generator(sampling.seed)
        state = OutputState(sampling, self.tokenizer)  # before registering: it may raise
        self._seqs[request_id] = seq
        self._states[request_id] = state
        if grammar is not None:
            self._grammars[request_id] = grammar
        self.counters.prompt_tokens += seq.num_prompt_tokens
        return seq

    def abort(self, request_id: str) -> EngineOutput | None:
        """Stop ``request_id`` and free its blocks (mutates). Returns its final output, or
        None when it is unknown or already finished."""
        seq = self._seqs.get(request_id)
        if seq is None:
            return None
        self.scheduler.finish(seq, FinishReason.ABORT)
        return self._output(seq, finished=True)

    def unpin(self, request_id: str) -> None:
        """Release the prefix pinned by ``request_id`` (mutates; no-op if none). A request
        still running before its pin was taken will not take it any more."""
        seq = self._seqs.get(request_id)
        if seq is not None:
            seq.pin_prefix_tokens = 0
        self.block_manager.unpin(request_id)

    def reset_prefix_cache(self) -> int:
        """Empty the prefix cache of every block no request or pin holds (mutates; see
        BlockManager.reset_prefix_cache). Returns the number of blocks forgotten."""
        return self.block_manager.reset_prefix_cache()

    @property
    def grammar_backend(self) -> GrammarBackend:
        """The xgrammar compiler and cache, built on first use (mutates once)."""
        with self._grammar_lock:
            if self._grammar_backend is None:
                from eclectus.server.engine.structured import GrammarBackend

                vocab_size = self.model_config.vocab_size
                self._grammar_backend = GrammarBackend(
                    self.tokenizer, vocab_size, self.config.json_whitespace
                )
            return self._grammar_backend

    @property
    def has_unfinished(self) -> bool:
        return bool(self._seqs)

    @property
    def request_ids(self) -> list[str]:
        """The ids of the requests queued or running (pure)."""
        return list(self._seqs)

    def stats(self) -> EngineStats:
        """A snapshot of load and counters (pure). Every counter but the step count is an
        EngineStats field of its name (a new one cannot be left out: it would not fit)."""
        counted, bm = asdict(self.counters), self.block_manager
        num_steps = counted.pop("num_steps")
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            num_cached_blocks=bm.num_cached_blocks,
            num_preemptions=self.scheduler.num_preemptions,
            **counted,
            extra={
                "num_steps": float(num_steps),
                "num_pinned": float(len(bm.pins)),
                # referenced blocks over all blocks: what admission control should watch
                "kv_usage": 1.0 - bm.num_free_blocks / bm.num_blocks,
            },
        )

    # ---- the step -------------------------------------------------------------------------

    def step(self) -> list[EngineOutput]:
        """Schedule, run, postprocess (mutates everything). Returns this step's outputs.

        Raises StepFailed when the forward raises; the requests of that step are then
        finished with "error" and freed, and the engine stays usable. A request whose own
        sampling or detokenizing raises fails alone: its output has finish_reason "error"
        (the reason in :attr:`failures`) and the rest of the batch goes on.
        """
        try:
            return self._step()
        finally:
            self._publish_events()

    def _step(self) -> list[EngineOutput]:
        out = self.scheduler.schedule()
        outputs = [self._output(seq, finished=True) for seq in out.failed]
        self.counters.cache_hit_tokens += out.num_cache_hit_tokens
        if out.is_empty:
            return outputs
        self.counters.num_steps += 1
        try:
            items, logits = self.runner.execute(out)
        except Exception as exc:
            raise StepFailed(self._fail_step(out), exc, outputs) from exc
        tokens = self._sample(logits, [item.seq for item in items])
        return outputs + self._postprocess(out, items, tokens)

    def _publish_events(self) -> None:
        """The step's KV events, as one batch (mutates: hands them to the publisher)."""
        if self.kv_publisher is not None:
            events = self.block_manager.take_events()
            if events:
                self.kv_publisher.publish(KVEventBatch(ts=time.time(), events=events))

    def close(self) -> None:
        """Release what outlives a step: the KV events publisher (mutates; idempotent)."""
        if self.kv_publisher is not None:
            self.kv_publisher.close()

    def pop_failure(self, request_id: str) -> str:
        """Why ``request_id`` finished with "error" (mutates: forgets the reason)."""
        return self.failures.pop(request_id, "the engine failed this request")

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int | Exception]:
        """One token per row (mutates the generators). The batch is sampled in one call; if
        that raises, row by row, so a request whose parameters break the sampler gets its
        exception in place of a token and nobody else's fails with it."""
        bitmask = self._bitmask(seqs)  # constrained rows: only what their grammar allows
        try:
            return list(
                self.sampler(
                    logits, [s.sampling for s in seqs], [s.generator for s in seqs], bitmask
                )
            )
        except Exception:
            pass
        tokens: list[int | Exception] = []
        for row, seq in enumerate(seqs):
            rows = slice(row, row + 1)
            mask = None if bitmask is None else bitmask[rows]
            try:
                tokens += self.sampler(logits[rows], [seq.sampling], [seq.generator], mask)
            except Exception as exc:
                tokens.append(exc)
        return tokens

    def _bitmask(self, seqs: list[Sequence]) -> torch.Tensor | None:
        """The step's allowed-token bitmask, None when no request is constrained (pure)."""
        if not self._grammars:
            return None
        return self.grammar_backend.bitmask([self._grammars.get(s.request_id) for s in seqs])

    def _fail_step(self, out: SchedulerOutput) -> list[str]:
        request_ids = []
        for item in out.scheduled:
            self.block_manager.forget(item.seq)  # its KV may be half written
            self.scheduler.finish(item.seq, FinishReason.ERROR)
            self._forget(item.seq.request_id)
            request_ids.append(item.seq.request_id)
        return request_ids

    def _postprocess(
        self, out: SchedulerOutput, items: list[ScheduledSeq], tokens: list[int | Exception]
    ) -> list[EngineOutput]:
        for item in out.scheduled:
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            self.counters.prefill_tokens += item.num_prefill_tokens
            pinned = seq.pinned_prefix_tokens
            if pinned and seq.num_computed_tokens >= pinned:
                self.block_manager.pin(seq.request_id, seq, pinned)
        outputs = []
        for item, token in zip(items, tokens, strict=True):
            seq = item.seq
            try:
                if isinstance(token, Exception):
                    raise token
                grammar = self._grammars.get(seq.request_id)
                if grammar is None:
                    reason = self._append(seq, token)
                else:
                    reason = self._append_constrained(seq, grammar, token)
                if reason is not None:
                    self.scheduler.finish(seq, reason)
                outputs.append(self._output(seq, finished=reason is not None))
            except Exception as exc:  # this request's own parameters: it fails alone
                outputs.append(self._fail_request(seq, exc))
        return outputs

    def _fail_request(self, seq: Sequence, exc: Exception) -> EngineOutput:
        """Finish ``seq`` with "error" and free it (mutates); its KV is sound (the forward
        passed), so its cached blocks stay usable for others."""
        self.scheduler.finish(seq, FinishReason.ERROR)
        self._forget(seq.request_id)
        self.failures[seq.request_id] = f"{type(exc).__name__}: {exc}"
        return EngineOutput(
            seq.request_id,
            "",
            (),
            finished=True,
            finish_reason=FinishReason.ERROR.value,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_output_tokens=seq.num_output_tokens,
        )

    def _append(self, seq: Sequence, token: int) -> FinishReason | None:
        """Add one output token; the finish reason if it ends the request (mutates)."""
        seq.token_ids.append(token)
        self.counters.generated_tokens += 1
        return self._check_finish(seq, token)

    def _append_constrained(
        self, seq: Sequence, grammar: GrammarState, token: int
    ) -> FinishReason | None:
        """Add a constrained request's sampled token (replaced by the closing policy's
        when the budget needs it), then the grammar's forced continuation (jump-forward),
        each accepted by its matcher. Finishes when the grammar is done (mutates)."""
        if self.config.budget_guarantee:
            token = grammar.check_budget(token, self._tokens_left(seq))
        grammar.accept(token)
        if grammar.is_terminated:  # only a stop token terminates it
            return self._end_with_stop(seq, token)
        reason = self._append(seq, token)
        if reason is None and self.config.jump_forward:  # never forces a stop token
            for forced in grammar.jump_forward(self._tokens_left(seq)):
                reason = self._append(seq, forced)
                if reason is not None:
                    break
        if reason is None and (stop := grammar.forced_stop()) is not None:
            grammar.accept(stop)
            return self._end_with_stop(seq, stop)
        return reason

    def _end_with_stop(self, seq: Sequence, token: int) -> FinishReason:
        """End on the stop token that terminated the grammar (mutates): in the ids, not in
        the text, even under ``ignore_eos`` or with ``skip_special_tokens`` off, as vLLM
        leaves the token that stopped a request out of its text."""
        seq.token_ids.append(token)
        self.counters.generated_tokens += 1
        return self._states[seq.request_id].flush() or FinishReason.STOP

    def _tokens_left(self, seq: Sequence) -> int:
        """Output tokens ``seq`` may still add: max_tokens and the context window (pure)."""
        left = seq.max_total_tokens - seq.num_tokens
        if seq.sampling.max_tokens is not None:
            left = min(left, seq.sampling.max_tokens - seq.num_output_tokens)
        return left

    def _check_finish(self, seq: Sequence, token: int) -> FinishReason | None:
        state = self._states[seq.request_id]
        reason = state.append_token(token)
        max_tokens = seq.sampling.max_tokens  # None: until EOS or the context window
        if reason is None and max_tokens is not None and seq.num_output_tokens >= max_tokens:
            reason = FinishReason.LENGTH
        if reason is None and seq.num_tokens >= seq.max_total_tokens:
            reason = FinishReason.LENGTH
        if reason is not None:
            reason = state.flush() or reason  # held-back text may still hit a stop string
        return reason

    def _output(self, seq: Sequence, finished: bool) -> EngineOutput:
        state = self._states[seq.request_id]
        text, token_ids = state.take_delta(seq.token_ids, seq.num_prompt_tokens, finished)
        if finished:
            self._forget(seq.request_id)
        return EngineOutput(
            seq.request_id,
            text,
            token_ids,
            finished=finished,
            finish_reason=seq.finish_reason.value if finished and seq.finish_reason else None,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_output_tokens=seq.num_output_tokens,
        )

    def _forget(self, request_id: str) -> None:
        self._seqs.pop(request_id, None)
        self._states.pop(request_id, None)
        self._grammars.pop(request_id, None)
