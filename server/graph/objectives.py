"""Objectives: what a get asks for, merged upstream through the DAG, and the rank it gives.

A get carries criteria: ``latency`` (someone waits on it), ``deadline`` (done within
``deadline_ms``) or ``throughput`` (as much work per second as possible). Every call upstream
of the get inherits the strongest objective of all gets downstream of it: latency beats
deadline beats throughput, and the earliest deadline wins. Calls are then ranked by
:func:`rank_key`; smaller runs first. A /v1 request may also name vLLM's ``priority`` (lower
runs first), which ranks it within its class, as an outer Eclectus ranks the requests it sends
to this one as its engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from eclectus.protocol import Criteria

# Lower is stronger. latency and deadline share the urgent class; rank_key orders them.
_STRENGTH: dict[Criteria, int] = {"latency": 0, "deadline": 1, "throughput": 2}


@dataclass(frozen=True, slots=True)
class Objective:
    """One get's goal. ``deadline`` is an absolute time.monotonic() value, or None;
    ``priority`` is vLLM's request priority (lower first; 0 unless a /v1 request names one)."""

    criteria: Criteria = "throughput"
    deadline: float | None = None
    priority: int = 0

    @property
    def urgent(self) -> bool:
        """latency or deadline: the class that runs before throughput work."""
        return self.criteria != "throughput"

    def merge(self, other: Objective) -> Objective:
        """The stronger of two objectives, with the earlier deadline and the lower priority
        (pure)."""
        criteria = min(self.criteria, other.criteria, key=_STRENGTH.__getitem__)
        deadlines = [d for d in (self.deadline, other.deadline) if d is not None]
        priority = min(self.priority, other.priority)
        return Objective(criteria, min(deadlines) if deadlines else None, priority)


def objective_for_get(
    criteria: Criteria, deadline_ms: float | None, now: float, priority: int = 0
) -> Objective:
    """The objective a get frame (or a /v1 request, with its ``priority``) asks for (pure).
    A deadline_ms without criteria 'deadline' still bounds the work; 'deadline' without
    deadline_ms is treated as latency."""
    deadline = now + deadline_ms / 1000.0 if deadline_ms is not None else None
    if criteria == "deadline" and deadline is None:
        criteria = "latency"
    return Objective(criteria, deadline, priority)


RankKey = tuple[int, float, int, float, str, int]


def rank_key(
    objective: Objective,
    *,
    program_term: float,
    group: str | None,
    seq: int,
    implicit_deadline: float | None = None,
) -> RankKey:
    """The scheduler's order, smallest first (pure):

    1. criteria class: latency/deadline before throughput;
    2. urgency: latency first (-inf; under the ``deadline`` policy its
       ``implicit_deadline`` instead), then the earliest deadline;
    3. the request's priority (vLLM's: lower first; 0 for every call but a /v1 request's that
       names one), so an outer scheduler's order holds among the requests it sends here;
    4. the program term of the program-level policy (policies.py: app-FIFO with aging by
       default, or least attained service), a value that never needs recomputing as time
       passes;
    5. group id, so the members of a task group sit together; 6. submission order.
    """
    if objective.criteria == "latency":
        urgency = -math.inf if implicit_deadline is None else implicit_deadline
    else:
        urgency = objective.deadline if objective.deadline is not None else math.inf
    return (
        0 if objective.urgent else 1,
        urgency,
        objective.priority,
        program_term,
        group or "",
        seq,
    )


def engine_priority(key: RankKey, epoch: float, term_offset: float) -> float:
    """Flatten a rank key into EngineRequest.priority (lower first) so the engine admits its
    waiting requests in nearly the scheduler's order: the class dominates, then the deadline
    and the program term, both in seconds since ``epoch`` (the server's start; the term
    shifted by the policy's ``term_offset`` to about 0), and the request's priority (as
    seconds, so that a step of 1 outweighs most program terms) are summed (pure)."""
    urgent_class, urgency, priority, program_term, _group, _seq = key
    deadline_part = min(max(urgency - epoch, 0.0), 1e8)  # latency 0, none 1e8
    priority_part = min(max(priority, -1e8), 1e8)  # never across the class
    return urgent_class * 1e9 + deadline_part + priority_part + program_term - term_offset
