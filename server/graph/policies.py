"""Program-level policies: which program's call runs first among calls of one class.

The rank key (objectives.rank_key) orders by criteria class, then urgency, then the
request's priority, then a *program term* that one of these policies computes
(``eclectus serve --program-policy``):

``fifo``      app-FIFO with aging: the program term is the arrival of the call's program
              (:func:`program_arrival`: its graph's earliest activation, or an upstream
              call's; and for an eager app, whose calls reach the server one submit at a
              time with no edges between them, the first call of the session's current
              program), minus an aging credit of ``aging_rate`` seconds per second waited.
              Programs further along go first.
``las``       least attained service (Autellix, arXiv 2502.13965): the program term is the
              service the call's program has attained so far, in tokens the engine computed
              for it (prompt tokens not served from the prefix cache, plus generated tokens),
              over ``las_tokens_per_s``, minus the same aging credit. Attained service
              follows the graph where it has edges (ATLAS: a call's is the heaviest path of
              calls that produced its inputs, so parallel branches do not add up) and the
              session's timeline where it has none (an eager app's calls arrive one submit
              at a time: a call's is the most any of the session's finished calls had
              reached, which is PLAS's sum for a sequential program and the critical path
              for fan-outs). New programs (0 tokens) go before programs that have computed
              much; the aging credit bounds how long any call waits behind new ones
              (``service / (las_tokens_per_s * aging_rate)`` seconds).
``fair``      fair queueing of programs (virtual clock, every program one flow served at
              ``las_tokens_per_s``): the program term is app-FIFO's arrival plus the
              program's attained service (as ``las`` counts it) over ``las_tokens_per_s``,
              plus the same aging credit: a program ranks as if it had arrived
              ``service / las_tokens_per_s`` seconds later than it did. So a heavy
              program does not hold back the programs arriving behind it for ever
              (``fifo``'s failure: a new chat waits behind every older team), and a
              sequential program's later calls are not put behind every new arrival
              (``las``'s: its aging credit is per call and restarts at every step, so a
              chain that has computed 1,500 tokens waits behind 15 s of new programs at
              each step).
``deadline``  earliest deadline first across the urgent class: a deadline get's call ranks
              by its deadline, a latency get's by an implicit one, its graph's arrival plus
              ``latency_deadline_s``; the program term is app-FIFO's.

Every term is written so that it never needs recomputing as time passes
(``x - aging_rate * (now - enqueued_at)`` orders as ``x + aging_rate * enqueued_at``): the
ready queue stays a heap.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from eclectus.protocol import Usage
from eclectus.server.checks import require_range


class ProgramPolicy(StrEnum):
    FIFO = "fifo"
    LAS = "las"
    FAIR = "fair"
    DEADLINE = "deadline"


@dataclass(frozen=True, slots=True)
class PolicyParams:
    """The policies' knobs: their defaults and ranges live here, and ServerConfig's fields
    for them take both from here. Validated."""

    policy: ProgramPolicy = ProgramPolicy.FIFO
    aging_rate: float = 0.1  # seconds of rank credit per second waited (every policy)
    las_tokens_per_s: float = 1000.0  # las, fair: tokens of attained service worth a second
    latency_deadline_s: float = 5.0  # deadline: a latency get's implicit deadline
    # a session whose next call comes within this many seconds of its last activity
    # continues the same program (an eager agent's next turn, after a client-side tool and a
    # round trip); after a longer pause it starts a new one (a chat's next turn): a new
    # arrival (fifo, fair, deadline) and its attained service from none (every policy)
    program_gap_s: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.policy, ProgramPolicy):  # a str would compare as no policy
            raise TypeError(f"policy must be a ProgramPolicy, got {self.policy!r}")
        require_range("aging_rate", self.aging_rate, 0, inclusive=True)
        require_range("las_tokens_per_s", self.las_tokens_per_s, 0, inclusive=False)
        require_range("latency_deadline_s", self.latency_deadline_s, 0, inclusive=False)
        require_range("program_gap_s", self.program_gap_s, 0, inclusive=True)


def program_term(
    params: PolicyParams, *, arrival: float, service_tokens: int, enqueued_at: float
) -> float:
    """The rank key's program term of a call queued at ``enqueued_at`` (pure; smaller
    first). ``arrival``: its graph's arrival; ``service_tokens``: its program's attained
    service (:func:`attained_service`)."""
    aging = params.aging_rate * enqueued_at
    if params.policy is ProgramPolicy.LAS:
        return service_tokens / params.las_tokens_per_s + aging
    if params.policy is ProgramPolicy.FAIR:
        return arrival + service_tokens / params.las_tokens_per_s + aging
    return arrival + aging


def program_arrival(
    params: PolicyParams, *, now: float, current: float | None, last_active: float, busy: bool
) -> float:
    """The arrival a session's newly activated calls rank by (pure): ``current``, its
    program's, while the session is busy (a call of it running) or was active
    (an activation or a finished call) within ``program_gap_s``; else ``now``, a new
    program. Without it an eager program's every call would rank as a new arrival, and a
    sequential agent would queue behind every program that started after it, once per
    turn (Autellix: the calls of one program are one unit)."""
    if current is not None and (busy or now - last_active <= params.program_gap_s):
        return current
    return now


def term_offset(params: PolicyParams, epoch: float) -> float:
    """What :func:`program_term` is near for a call queued at ``epoch`` (pure): subtracted
    when the rank is flattened into an engine priority, so that number stays small."""
    if params.policy is ProgramPolicy.LAS:
        return params.aging_rate * epoch
    return (1.0 + params.aging_rate) * epoch


def implicit_deadline(params: PolicyParams, arrival: float) -> float | None:
    """A latency get's deadline under the ``deadline`` policy; None under the others, where
    latency work ranks before every deadline (pure)."""
    if params.policy is ProgramPolicy.DEADLINE:
        return arrival + params.latency_deadline_s
    return None


def computed_tokens(usage: Usage | None) -> int:
    """Tokens the engine computed for one output (pure): its prompt less what the prefix
    cache served, plus what it generated."""
    if usage is None:
        return 0
    return max(usage.prompt_tokens - usage.cached_tokens, 0) + usage.completion_tokens


def attained_service(input_services: list[int], linked: bool, session_service: int) -> int:
    """A queued call's attained service (pure): with inputs that other calls produced
    (``linked``), the heaviest of their paths (ATLAS); else the session's (an eager app's
    timeline, or a graph's first call)."""
    if linked:
        return max(input_services, default=0)
    return session_service
