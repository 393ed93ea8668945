"""The step scheduler: which requests compute how many tokens this step (continuous batching,
chunked prefill under a token budget, preemption by recompute)."""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

from eclectus.server.engine.block_manager import BlockManager
from eclectus.server.engine.sequence import FinishReason, Sequence, SequenceStatus


def _rank(seq: Sequence) -> tuple[float, int]:
    """Scheduling order: lower priority value first, then arrival (pure)."""
    return seq.priority, seq.arrival


@dataclass(slots=True)
class ScheduledSeq:
    """One request's share of a step."""

    seq: Sequence
    num_new_tokens: int  # tokens computed this step: token_ids[computed : computed + n]
    num_prefill_tokens: int  # of those, how many re-/compute known tokens (not a decode)

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the tokens, so it samples the next one."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """What one step runs. Built by :meth:`StepScheduler.schedule`, read by runner and engine."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)  # running order
    preempted: list[Sequence] = field(default_factory=list)  # went back to waiting this step
    failed: list[Sequence] = field(default_factory=list)  # can never fit; finished "length"
    num_cache_hit_tokens: int = 0  # prompt tokens admitted from the prefix cache this step

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class StepScheduler:
    """Holds the waiting queue and the running list. Every method mutates unless it says so."""

    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_background_seqs: int | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_background_seqs = max_background_seqs
        self.waiting: list[tuple[float, int, Sequence]] = []  # heap by (priority, arrival)
        self.running: list[Sequence] = []  # sorted by (priority, arrival)
        self.num_preemptions = 0
        self._prefill_targets: dict[str, int] = {}  # request -> tokens known at admission
        self._background_slots: int | None = None  # this step's seats left for background

    @property
    def num_waiting(self) -> int:
        return sum(1 for _, _, s in self.waiting if not s.is_finished)

    @property
    def has_work(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def add(self, seq: Sequence) -> None:
        """Queue a new (or preempted) sequence for admission."""
        heapq.heappush(self.waiting, (seq.priority, seq.arrival, seq))

    def schedule(self) -> SchedulerOutput:
        """Choose this step's work.

        Model (vLLM v1): every request has ``num_computed_tokens``; a step gives it some of its
        remaining ``num_tokens - num_computed_tokens`` tokens. A decode is simply a request
        with one remaining token; a long prompt is cut into chunks. There are no phases.

        Latency first within a step:

        * Pass 1, the decodes (one remaining token) of every running request, in (priority,
          arrival) order: they are cheap and keep every stream moving.
        * Pass 2, prefill chunks in (priority, arrival) order over running AND waiting
          requests together: a running request takes ``min(remaining, budget)``; a waiting one
          takes its prefix-cache hits and a chunk. So a high-priority request's prefill runs
          in the same step as (and before) a low-priority long prefill that is already
          running, instead of waiting for the latter to finish.

        When a running request's blocks do not fit, the lowest-ranked running request not yet
        scheduled this step is preempted (blocks freed, recomputed later) until they do;
        when none ranks below it, the request itself is preempted (or fails with "length"
        when it is alone). Requests already scheduled this step are never preempted: their
        newly filled blocks are already hashed. Waiting requests are admitted only while
        nobody was preempted this step, and admission stops at the first waiting request
        that does not fit or when the seats run out (rank order holds among them).

        While a foreground request is running or waiting, at most ``max_background_seqs``
        background requests (the best-ranked ones) take part in a step, in both passes; the
        others keep their blocks and wait. Background work that was already running when a
        latency-critical request arrived would otherwise share every one of its steps.
        """
        out = SchedulerOutput()
        scheduled: set[int] = set()  # id() of sequences scheduled this step
        self._background_slots = self._background_limit()
        budget = self._schedule_decodes(out, self.max_num_batched_tokens, scheduled)
        self._schedule_chunks(out, budget, scheduled)
        assert out.num_batched_tokens <= self.max_num_batched_tokens
        assert len(self.running) <= self.max_num_seqs
        return out

    def _background_limit(self) -> int | None:
        """This step's seats for background requests: ``max_background_seqs`` while any
        foreground request is running or waiting, else None (no limit). Pure, except that it
        drops aborted requests from the head of the waiting heap."""
        if self.max_background_seqs is None:
            return None
        head = self._next_waiting()  # foreground ranks first, so the head tells
        if any(not s.background for s in self.running) or (head and not head.background):
            return self.max_background_seqs
        return None

    def _seat_free(self, seq: Sequence) -> bool:
        """Whether ``seq`` may compute this step: foreground always, background while the
        step has a background seat left (pure)."""
        return not seq.background or self._background_slots is None or self._background_slots > 0

    def _mark_scheduled(self, seq: Sequence, scheduled: set[int]) -> None:
        """Note ``seq`` as scheduled this step; a background one takes a seat (mutates)."""
        scheduled.add(id(seq))
        if seq.background and self._background_slots is not None:
            self._background_slots -= 1

    def _schedule_decodes(self, out: SchedulerOutput, budget: int, scheduled: set[int]) -> int:
        for seq in [s for s in self.running if s.num_uncomputed_tokens == 1]:
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted by a decode above it
                continue
            if not self._seat_free(seq):
                continue
            if self._make_room(seq, 1, out, scheduled):
                out.scheduled.append(self._scheduled(seq, 1))
                self._mark_scheduled(seq, scheduled)
                budget -= 1
        return budget

    def _schedule_chunks(self, out: SchedulerOutput, budget: int, scheduled: set[int]) -> None:
        chunks = [s for s in self.running if id(s) not in scheduled and s.num_uncomputed_tokens]
        index, admit = 0, True
        while budget > 0:
            while index < len(chunks) and chunks[index].status is not SequenceStatus.RUNNING:
                index += 1  # preempted (or failed) earlier in this step
            running = chunks[index] if index < len(chunks) else None
            waiting = self._next_waiting() if admit and not out.preempted else None
            if waiting is not None and len(self.running) >= self.max_num_seqs:
                waiting = None
            if running is None and waiting is None:
                break
            if waiting is not None and (running is None or _rank(waiting) < _rank(running)):
                if not self._seat_free(waiting):
                    admit = False  # background, no seat left: nor for those ranked below
                    continue
                admitted = self._admit(waiting, out, budget)
                if admitted is None:
                    admit = False  # rank order among the waiting: stop at the first misfit
                else:
                    self._mark_scheduled(waiting, scheduled)
                    budget -= admitted
                continue
            index += 1
            if not self._seat_free(running):
                continue
            num_new = min(running.num_uncomputed_tokens, budget)
            if self._make_room(running, num_new, out, scheduled):
                out.scheduled.append(self._scheduled(running, num_new))
                self._mark_scheduled(running, scheduled)
                budget -= num_new

    def _next_waiting(self) -> Sequence | None:
        """The best-ranked live waiting sequence (drops aborted ones from the heap)."""
        while self.waiting:
            seq = self.waiting[0][2]
            if not seq.is_finished:
                return seq
            heapq.heappop(self.waiting)  # aborted while waiting
        return None

    def _make_room(
        self, seq: Sequence, num_new: int, out: SchedulerOutput, scheduled: set[int]
    ) -> bool:
        """Allocate ``num_new`` slots for running ``seq``, preempting lower-ranked running
        requests not yet scheduled this step until they fit. False when ``seq`` itself was
        preempted (or failed, being alone)."""
        while not self.block_manager.allocate_slots(seq, num_new):
            victim = self._victim(seq, scheduled)
            if victim is seq:
                if len(self.running) == 1:  # alone and still too big for the pool
                    self._fail(seq, out)
                else:
                    self._preempt(seq, out)
                return False
            self._preempt(victim, out)
        return True

    def _victim(self, seq: Sequence, scheduled: set[int]) -> Sequence:
        """The lowest-ranked running sequence below ``seq`` not scheduled this step, else
        ``seq`` itself (pure)."""
        for victim in reversed(self.running):
            if victim is seq:
                return seq
            if id(victim) not in scheduled:
                return victim
        return seq

    def _admit(self, seq: Sequence, out: SchedulerOutput, budget: int) -> int | None:
        """Admit waiting ``seq`` (the head of the heap) with its hits and a chunk; returns
        the tokens it computes this step, or None when it does not fit (left waiting)."""
        bm = self.block_manager
        hits = bm.find_cached_blocks(seq)
        num_hit_tokens = len(hits) * bm.block_size
        num_new = min(seq.num_tokens - num_hit_tokens, budget)
        if not bm.allocate_slots(seq, num_new, hits):
            if not self.running and not out.scheduled:  # an empty pool can't hold it
                heapq.heappop(self.waiting)
                self._fail(seq, out)
                return 0
            return None
        heapq.heappop(self.waiting)
        if seq.status is SequenceStatus.WAITING:  # first admission, not a recompute
            seq.num_cached_tokens = num_hit_tokens
            out.num_cache_hit_tokens += num_hit_tokens
        seq.num_computed_tokens = num_hit_tokens
        seq.status = SequenceStatus.RUNNING
        self._prefill_targets[seq.request_id] = seq.num_tokens
        bisect.insort(self.running, seq, key=_rank)
        out.scheduled.append(self._scheduled(seq, num_new))
        return num_new

    def _scheduled(self, seq: Sequence, num_new: int) -> ScheduledSeq:
        target = self._prefill_targets.get(seq.request_id, 0)
        start = seq.num_computed_tokens
        num_prefill = max(0, min(start + num_new, target) - start)
        return ScheduledSeq(seq, num_new, num_prefill)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """RUNNING -> PREEMPTED: free the blocks, recompute later (the prefix cache usually
        keeps most of them, so recompute is cheap)."""
        assert seq.status is SequenceStatus.RUNNING, seq.status
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(seq)
        self.add(seq)

    def _fail(self, seq: Sequence, out: SchedulerOutput) -> None:
        """A request that cannot fit even in an otherwise empty pool ends with "length"."""
        if seq in self.running:
            self.running.remove(seq)
        self.block_manager.free(seq)
        self._prefill_targets.pop(seq.request_id, None)
        seq.finish(FinishReason.LENGTH)
        out.failed.append(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End ``seq`` (running or waiting) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        self.block_manager.free(seq)
        self._prefill_targets.pop(seq.request_id, None)
        seq.finish(reason)  # a waiting one stays in the heap, skipped when it surfaces
