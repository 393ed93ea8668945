"""Objectives: what a get asks for, merged upstream through the DAG, and the rank it gives.

A get carries criteria: ``latency`` (someone waits on it), ``deadline`` (done within
``deadline_ms``) or ``throughput`` (as much work per second as possible). Every call upstream
of the get inherits the strongest objective of all gets downstream of it: latency beats
deadline beats throughput, and the earliest deadline wins. Calls are then ranked by
:func:`rank_key`; smaller runs first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from eclectus.server.protocol import Criteria

# Lower is more urgent. latency and deadline share the urgent class; slack orders them.
_STRENGTH: dict[Criteria, int] = {"latency": 0, "deadline": 1, "throughput": 2}


@dataclass(frozen=True, slots=True)
class Objective:
    """One get's goal. ``deadline`` is an absolute time.monotonic() value, or None."""

    criteria: Criteria = "throughput"
    deadline: float | None = None

    @property
    def urgent(self) -> bool:
        """latency or deadline: the class that runs before throughput work."""
        return self.criteria != "throughput"

    def merge(self, other: Objective) -> Objective:
        """The stronger of two objectives, with the earlier deadline (pure)."""
        criteria = min(self.criteria, other.criteria, key=_STRENGTH.__getitem__)
        deadlines = [d for d in (self.deadline, other.deadline) if d is not None]
        return Objective(criteria, min(deadlines) if deadlines else None)

    def slack(self, now: float) -> float:
        """Seconds left before the deadline (0 for latency: it is due now; inf without one)."""
        if self.criteria == "latency":
            return 0.0
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - now)


def objective_for_get(criteria: Criteria, deadline_ms: float | None, now: float) -> Objective:
    """The objective a get frame asks for (pure). A deadline_ms without criteria 'deadline'
    still bounds the work; 'deadline' without deadline_ms is treated as latency."""
    deadline = now + deadline_ms / 1000.0 if deadline_ms is not None else None
    if criteria == "deadline" and deadline is None:
        criteria = "latency"
    return Objective(criteria, deadline)


RankKey = tuple[int, float, float, str, int]


def rank_key(
    objective: Objective,
    *,
    app_arrival: float,
    enqueued_at: float,
    now: float,
    aging_rate: float,
    group: str | None,
    seq: int,
) -> RankKey:
    """The scheduler's order, smallest first (pure):

    1. criteria class: latency/deadline before throughput;
    2. deadline slack (latency has none left: 0);
    3. app-FIFO: the application's arrival time, minus an aging credit of ``aging_rate``
       seconds per second waited, so an old application's later calls go before a new
       application's, yet nothing waits forever;
    4. group id, so the members of a task group sit together; 5. submission order.
    """
    aging_credit = aging_rate * max(0.0, now - enqueued_at)
    return (
        0 if objective.urgent else 1,
        objective.slack(now),
        app_arrival - aging_credit,
        group or "",
        seq,
    )


def engine_priority(key: RankKey, epoch: float) -> float:
    """Flatten a rank key into EngineRequest.priority (lower first) so the engine admits its
    waiting requests in nearly the scheduler's order: the class dominates, then slack and
    the app rank in seconds since ``epoch`` (the server's start) are summed (pure)."""
    urgent_class, slack, app_rank, _group, _seq = key
    return urgent_class * 1e9 + min(slack, 1e8) + (app_rank - epoch)
