"""Admission: what goes to the engine now, and what waits in the scheduler's queue.

Why. An engine that holds a queue of its own orders it by what it knows: vLLM's
``--scheduling-policy priority`` ranks only what is already waiting there, and everything it
runs shares every step (a request's decode slows with each one beside it). The scheduler knows
more: which calls belong to which program, how far along each program is, who waits. So
requests go to the engine only while it has room for them, and the rest wait here, ranked by
the scheduler's policy, which a program's progress can still change (policies.py).

Two limits, both read from the engine itself (``Backend.capacity()``: the built-in engine's
budgets and KV pool; a remote pool's per-engine cap and each vLLM's KV cache, from its
``/metrics``):

1. **sequences**: at most the engines' batch (their ``max_num_seqs``, or a remote pool's
   ``--engine-max-inflight`` per engine), and at most ``ServerConfig.max_engine_seqs`` per
   engine: a smaller batch that still keeps the engine busy leaves the order to the
   scheduler (docs/architecture.md, "Admission"); ``auto``: the batch at the engine's
   throughput knee, learned from its decode steps (batch_knee.py). Task groups and map
   instances count like any call.
2. **KV**: a request reserves its prompt plus its ``max_tokens`` (the most KV it can come to
   hold; in whole blocks where the engines' block size is known, as they allocate it) before
   it is sent, and waits, in rank order, while the reservations would pass
   ``kv_admit_fraction`` of the KV cache, so a burst of long prompts never makes the engine
   preempt and recompute. Where the engines share prefixes (``shared_block_size``: prefix
   caching on), a prompt's leading full blocks that a request already admitted holds are
   counted once, as the engine holds them once: twenty chats over one 1,000-token system
   prompt reserve it once, not twenty times. Blocks are keyed as the built-in engine's prefix
   cache keys them (``prefix_cache.hash_block_tokens``: each key chains every id before it,
   from a root salted with the tenant, whose KV no other tenant shares; a remote engine gets
   the tenant as ``cache_salt``). Only while a KV budget applies are the keys computed. One
   request is always let in alone, however large.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from eclectus.server.backend import EngineCapacity
from eclectus.server.config import ServerConfig
from eclectus.server.engine.prefix_cache import BlockHash, hash_block_tokens, root_hash
from eclectus.server.graph.batch_knee import BatchKnee, DecodeMark


def backend_capacity(backend: Any) -> EngineCapacity:
    """``backend.capacity()`` where the backend has one, else nothing known (pure)."""
    capacity = getattr(backend, "capacity", None)
    return capacity() if capacity is not None else EngineCapacity()


def block_keys(
    token_ids: Sequence[int], block_size: int, tenant: str | None
) -> tuple[BlockHash, ...]:
    """One key per full block of ``token_ids``, chained as the engine's prefix cache chains
    them: equal keys mean the same tenant and equal ids up to that block's end (pure)."""
    keys: list[BlockHash] = []
    key = root_hash(tenant)
    for end in range(block_size, len(token_ids) + 1, block_size):
        key = hash_block_tokens(key, token_ids[end - block_size : end])
        keys.append(key)
    return tuple(keys)


@dataclass(slots=True, eq=False)
class KvReservation:
    """One request's hold on the KV budget: its prompt's full blocks (``keys``, shared
    with other holders of the same keys, ``block_size`` tokens each) and what is its alone
    (``private``: the prompt's last partial block and every token it may write). A plain
    class, not a generator: a task the loop discards mid-wait must still give it back."""

    admission: Admission
    keys: tuple[BlockHash, ...]
    block_size: int
    private: int
    priority: float

    async def __aenter__(self) -> None:
        await self.admission._reserve(self)

    async def __aexit__(self, *exc: object) -> None:
        self.admission._release(self)


@dataclass(order=True, slots=True)
class _Waiter:
    priority: float
    seq: int
    reservation: KvReservation = field(compare=False)
    granted: asyncio.Future[None] = field(compare=False)


class Admission:
    """The scheduler's admission rules for one backend. Methods that change state say so."""

    def __init__(self, backend: Any, config: ServerConfig) -> None:
        self.backend = backend
        self.config = config
        self.num_reserved_tokens = 0
        self.num_kv_waits = 0  # requests that waited for KV room (metrics, tests)
        self._held: Counter[BlockHash] = Counter()  # block key -> admitted requests holding it
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        # --max-engine-seqs auto: the batch at the engines' knee, learned as they decode
        self.knee = BatchKnee() if config.max_engine_seqs == "auto" else None

    def max_inflight(self) -> int:
        """Requests that may be in flight now, all sessions together (pure)."""
        cap = self.config.max_inflight
        if self.config.admission == "off":
            return cap
        capacity = backend_capacity(self.backend)
        num_engines = max(capacity.num_engines, 1)
        seqs = capacity.max_seqs if capacity.max_seqs is not None else math.inf
        per_engine = self.config.max_engine_seqs
        if self.knee is not None:  # --max-engine-seqs auto
            ceiling = min(cap, seqs) // num_engines
            per_engine = self.knee.cap(max(int(ceiling), 1))
        if isinstance(per_engine, int):
            seqs = min(seqs, per_engine * num_engines)
        return int(min(cap, seqs))

    def note_inflight(self, num_inflight: int) -> None:
        """The scheduler's in-flight count changed (mutates: the knee's integral, if any)."""
        if self.knee is not None:
            self.knee.set_inflight(num_inflight, backend_capacity(self.backend).num_engines)

    def decode_mark(self, num_tokens: int, num_prefilled: int) -> DecodeMark | None:
        """A request's first tokens arrived, its ``num_prefilled`` prompt tokens computed
        (mutates: the knee's prefill count); None when no knee is learned."""
        if self.knee is None:
            return None
        self.knee.add_prefill(num_prefilled)
        return self.knee.mark(num_tokens)

    def decode_done(self, mark: DecodeMark | None, num_tokens: int) -> None:
        """A request marked by :meth:`decode_mark` finished (mutates: the knee's samples)."""
        if self.knee is not None and mark is not None:
            self.knee.finish(mark, num_tokens)

    def kv_budget(self) -> int | None:
        """Tokens of KV the admitted requests may reserve together; None: no limit (pure)."""
        return self._budget(backend_capacity(self.backend))

    def _budget(self, capacity: EngineCapacity) -> int | None:
        if self.config.admission == "off" or capacity.kv_tokens is None:
            return None
        return int(capacity.kv_tokens * self.config.kv_admit_fraction)

    def kv(
        self, token_ids: Sequence[int], max_tokens: int, priority: float, tenant: str | None
    ) -> KvReservation:
        """``async with`` it to hold the KV of ``tenant``'s request with prompt ``token_ids``
        that may write ``max_tokens`` while inside (pure until entered; entering mutates the
        reservations and waits, behind waiters of a smaller ``priority``, while it would not
        fit)."""
        capacity = backend_capacity(self.backend)  # read once: dispatch asks it per call
        budgeted = self._budget(capacity) is not None  # keys only while a KV budget applies
        block_size = (capacity.shared_block_size or 0) if budgeted else 0
        keys = block_keys(token_ids, block_size, tenant) if block_size else ()
        private = len(token_ids) - len(keys) * block_size + max_tokens
        if block_size:  # the engine holds whole blocks: the last partial one counts whole
            private = -(-private // block_size) * block_size
        return KvReservation(self, keys, block_size, private, priority)

    def cost(self, reservation: KvReservation) -> int:
        """Tokens ``reservation`` would add to the reserved ones now: its private tokens and
        its blocks no admitted request holds yet (pure)."""
        new_blocks = sum(1 for key in reservation.keys if not self._held[key])
        return reservation.private + new_blocks * reservation.block_size

    async def _reserve(self, reservation: KvReservation) -> None:
        cost = self.cost(reservation)
        if not self._waiters and self._fits(cost):
            self._hold(reservation, cost)
            return
        waiter = _Waiter(
            reservation.priority,
            next(self._seq),
            reservation,
            asyncio.get_running_loop().create_future(),
        )
        heapq.heappush(self._waiters, waiter)
        self.num_kv_waits += 1
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._release(reservation)  # granted as it was cancelled: give it back
            elif waiter in self._waiters:  # (a grant pass may have dropped it already)
                self._waiters.remove(waiter)
                heapq.heapify(self._waiters)
                self._grant()
            raise

    def _fits(self, cost: int) -> bool:
        budget = self.kv_budget()
        return (
            budget is None
            or self.num_reserved_tokens == 0
            or self.num_reserved_tokens + cost <= budget
        )

    def _hold(self, reservation: KvReservation, cost: int) -> None:
        self.num_reserved_tokens += cost
        self._held.update(reservation.keys)

    def _release(self, reservation: KvReservation) -> None:
        freed = reservation.private
        for key in reservation.keys:
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]
                freed += reservation.block_size
        self.num_reserved_tokens -= freed
        assert self.num_reserved_tokens >= 0, self.num_reserved_tokens
        self._grant()

    def _grant(self) -> None:
        """Let the best waiters in while they fit, in rank order (mutates)."""
        while self._waiters:
            waiter = self._waiters[0]
            if waiter.granted.done():  # its task was cancelled and has not run yet: drop it
                heapq.heappop(self._waiters)
                continue
            cost = self.cost(waiter.reservation)
            if not self._fits(cost):
                return
            heapq.heappop(self._waiters)
            self._hold(waiter.reservation, cost)
            waiter.granted.set_result(None)
