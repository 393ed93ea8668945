"""The scheduler's ready queue: calls whose inputs are ready, across all sessions, by rank.

A binary heap per tenant, with lazy deletion: removing or re-ranking a call marks its entry
dead and (for a re-rank) pushes a fresh one, so every operation is O(log n) in the calls
plus O(T) in the tenants with queued calls, and a graph of thousands of ready calls does not
make each dispatch scan them all. Rank keys never go stale with time (objectives.rank_key
folds aging into a time-invariant term), so the heap order stays valid. One heap per tenant
lets the scheduler ask for the best call of the tenants still under their fair share
(``peek_best(skip=...)``) without walking past another tenant's backlog.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from eclectus.server.graph.graph import Node
from eclectus.server.graph.objectives import RankKey

if TYPE_CHECKING:
    from eclectus.server.graph.scheduler import AppState


@dataclass(slots=True, eq=False)
class QueuedCall:
    """One queued call. ``live`` turns False when it is dispatched, dropped or re-ranked."""

    app: AppState
    node: Node
    enqueued_at: float
    key: RankKey
    live: bool = True

    def __lt__(self, other: QueuedCall) -> bool:
        return self.key < other.key


@dataclass(slots=True)
class ReadyQueue:
    """Methods that change the queue say so; the rest are pure."""

    _heaps: dict[str | None, list[QueuedCall]] = field(default_factory=dict)  # by tenant
    _num_live: dict[str | None, int] = field(default_factory=dict)  # live calls by tenant
    _by_node: dict[tuple[str, str], QueuedCall] = field(default_factory=dict)
    _by_group: dict[str, dict[tuple[str, str], QueuedCall]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._by_node)

    def __iter__(self) -> Iterator[QueuedCall]:
        return iter(list(self._by_node.values()))

    def push(self, queued: QueuedCall) -> None:
        """Add a call (mutates); a call already queued is replaced (a re-rank)."""
        ident = (queued.app.session_id, queued.node.node_id)
        old = self._by_node.get(ident)
        if old is not None:
            self._forget(old)
        self._by_node[ident] = queued
        if queued.node.group is not None:
            self._by_group.setdefault(queued.node.group, {})[ident] = queued
        tenant = queued.app.tenant
        heapq.heappush(self._heaps.setdefault(tenant, []), queued)
        self._num_live[tenant] = self._num_live.get(tenant, 0) + 1

    def get(self, app: AppState, node: Node) -> QueuedCall | None:
        return self._by_node.get((app.session_id, node.node_id))

    def peek_best(self, skip: Collection[str | None] = ()) -> QueuedCall | None:
        """The best-ranked live call of a tenant not in ``skip``, left queued, or None (drops
        dead heap entries only). A tenant's heap exists while it has a live call (``_forget``
        drops it with the last), so each heap has a live top once its dead ones are popped."""
        best = None
        for tenant, heap in self._heaps.items():
            if tenant in skip:
                continue
            while not heap[0].live:
                heapq.heappop(heap)
            if best is None or heap[0] < best:
                best = heap[0]
        return best

    def take_group(self, group: str, limit: int | None = None) -> list[QueuedCall]:
        """Remove and return the queued members of ``group``, in rank order, at most
        ``limit`` of them (None: all) (mutates; the rest stay queued)."""
        members = sorted(self._by_group.get(group, {}).values())[:limit]
        for queued in members:
            self._forget(queued)
        return members

    def remove(self, calls: Iterable[QueuedCall]) -> None:
        """Drop calls from the queue (mutates)."""
        for queued in calls:
            if queued.live:
                self._forget(queued)

    def _forget(self, queued: QueuedCall) -> None:
        queued.live = False
        ident = (queued.app.session_id, queued.node.node_id)
        self._by_node.pop(ident, None)
        group = queued.node.group
        if group is not None and group in self._by_group:
            self._by_group[group].pop(ident, None)
            if not self._by_group[group]:
                del self._by_group[group]
        tenant = queued.app.tenant
        live = self._num_live[tenant] = self._num_live[tenant] - 1
        if live == 0:
            del self._num_live[tenant]
            self._heaps.pop(tenant, None)  # every entry left in it is dead
            return
        heap = self._heaps[tenant]
        if len(heap) > 64 and len(heap) > 4 * live:
            # mostly dead entries: rebuild so the heap does not grow without bound
            heap[:] = [q for q in heap if q.live]
            heapq.heapify(heap)
