"""The program types of the load eval, their sizes, the mix, and the arrival schedule.

Five types, each an ordinary LangChain/LangGraph app built from the recipes' code
(:mod:`.programs`):

=============  ==============================================================================
chat           one call over a system prompt every chat shares (a handbook); latency matters
map-reduce     4-8 maps over the program's own chunks, then a reduce
chain-summary  3-4 dependent refine steps
multi-agent    an architect (design, then file list), then 2-4 engineer pipelines (write,
               review, revise) sharing the design
tool-agent     a ReAct loop with client-side tools: 3 model turns (2 tool calls, the answer),
               each turn one client round trip
=============  ==============================================================================

Arrivals are open-loop: a Poisson process at ``rate`` programs/s over ``duration_s``, each
arrival's type drawn by the mix's weights and its shape (maps, steps, engineers) uniformly
from the type's range, all from one seed, so every system of a round gets the same schedule.
Sizes are estimated tokens (UTF-8 bytes; recipes/text.py): the eval's fresh, letter-permuted
text makes about 0.7 real ``tiny`` tokens per byte, so the 1,536-byte handbook is about 1,000
tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields

PROGRAM_TYPES = ("chat", "map-reduce", "chain-summary", "multi-agent", "tool-agent")
# the default mix (weights; normalised): chats are the most frequent, as in a GPTs-style
# store; the rest are the recipes' multi-call apps
DEFAULT_MIX: dict[str, float] = {
    "chat": 0.3,
    "map-reduce": 0.2,
    "chain-summary": 0.2,
    "multi-agent": 0.15,
    "tool-agent": 0.15,
}


@dataclass(frozen=True, slots=True)
class Sizes:
    """Every program type's sizes (estimated tokens) and shape ranges (inclusive)."""

    system_tokens: int = 1536  # the chats' shared handbook (~1k real tokens)
    answer_tokens: int = 32  # a chat's answer
    chunk_tokens: int = 384  # a map-reduce chunk, a chain-summary step's text
    map_tokens: int = 24  # a map's (and a refine step's) summary
    reduce_tokens: int = 32
    maps: tuple[int, int] = (4, 8)
    steps: tuple[int, int] = (3, 4)
    requirements_tokens: int = 384  # the team's requirements
    design_tokens: int = 48
    list_tokens: int = 16
    code_tokens: int = 32
    review_tokens: int = 16
    engineers: tuple[int, int] = (2, 4)
    tool_tokens: int = 48  # a forced tool call (its shortest is ~30 tokens on tiny)
    tool_answer_tokens: int = 32
    question_tokens: int = 48  # the head of the document a tool agent is asked about

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low, high = value if isinstance(value, tuple) else (value, value)
            if not 1 <= low <= high:
                raise ValueError(f"sizes.{f.name} must be >= 1 (a range low <= high): {value}")

    @classmethod
    def quick(cls) -> Sizes:
        """Small enough for CI: the same shapes at their smallest, a few tokens each."""
        return cls(
            system_tokens=256, answer_tokens=4, chunk_tokens=96, map_tokens=4, reduce_tokens=4,
            maps=(4, 4), steps=(3, 3), requirements_tokens=96, design_tokens=8, list_tokens=8,
            code_tokens=4, review_tokens=4, engineers=(2, 2), tool_tokens=40,
            tool_answer_tokens=4, question_tokens=32,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProgramSpec:
    """One program instance of a schedule: its type, arrival (s after the start), shape
    (maps, steps or engineers; 0 for chat and tool-agent) and its own input's seed."""

    index: int
    kind: str
    arrival_s: float
    shape: int
    seed: int


def parse_mix(text: str | None) -> dict[str, float]:
    """``chat=0.4,map-reduce=0.3,...`` as normalised weights; None: the default mix (pure).
    ValueError naming the entry for an unknown type, a bad weight or an empty mix."""
    if text is None:
        return _normalised(DEFAULT_MIX)
    weights: dict[str, float] = {}
    for entry in text.split(","):
        kind, sep, value = entry.strip().partition("=")
        if not sep or kind not in PROGRAM_TYPES:
            raise ValueError(
                f"--mix entry {entry!r}: TYPE=WEIGHT with TYPE one of {', '.join(PROGRAM_TYPES)}"
            )
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"--mix entry {entry!r}: the weight is not a number") from None
        if not weight >= 0:
            raise ValueError(f"--mix entry {entry!r}: the weight must be >= 0")
        weights[kind] = weight
    if not sum(weights.values()) > 0:
        raise ValueError("--mix: at least one type needs a weight > 0")
    return _normalised(weights)


def _normalised(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items() if w > 0}


def shape_range(kind: str, sizes: Sizes) -> tuple[int, int]:
    """The range a program's shape is drawn from (pure)."""
    return {
        "map-reduce": sizes.maps,
        "chain-summary": sizes.steps,
        "multi-agent": sizes.engineers,
    }.get(kind, (0, 0))


def schedule(
    rate: float, duration_s: float, mix: dict[str, float], sizes: Sizes, seed: int
) -> list[ProgramSpec]:
    """The programs arriving over ``duration_s`` at ``rate`` per second (Poisson), their
    types drawn by ``mix`` (pure: seeded)."""
    if not rate > 0 or not duration_s > 0:
        raise ValueError(f"rate and duration must be > 0, got {rate} and {duration_s}")
    rng = random.Random(seed)
    specs: list[ProgramSpec] = []
    now = rng.expovariate(rate)
    while now < duration_s:
        specs.append(_draw(rng, len(specs), now, mix, sizes))
        now += rng.expovariate(rate)
    return specs


def _draw(
    rng: random.Random, index: int, arrival_s: float, mix: dict[str, float], sizes: Sizes
) -> ProgramSpec:
    """One program arriving at ``arrival_s``: its type by ``mix``, its shape uniformly in
    the type's range, its input's seed (mutates ``rng``)."""
    kind = rng.choices(list(mix), list(mix.values()))[0]
    low, high = shape_range(kind, sizes)
    shape = rng.randint(low, high) if high else 0
    return ProgramSpec(index, kind, arrival_s, shape, rng.randrange(1 << 30))


def unloaded_schedule(
    mix: dict[str, float], sizes: Sizes, reps: int, seed: int
) -> list[ProgramSpec]:
    """``reps`` programs of every type in the mix at every shape it takes, each to run alone
    (the driver runs them one after another): the unloaded latencies the SLO is a multiple
    of (pure: seeded)."""
    rng = random.Random(seed)
    specs: list[ProgramSpec] = []
    for kind in mix:
        low, high = shape_range(kind, sizes)
        for shape in range(low, high + 1):
            for _ in range(reps):
                specs.append(ProgramSpec(len(specs), kind, 0.0, shape, rng.randrange(1 << 30)))
    return specs


def burst(num_programs: int, mix: dict[str, float], sizes: Sizes, seed: int) -> list[ProgramSpec]:
    """``num_programs`` programs all arriving at once, their types drawn by ``mix``: the
    backlog a capacity run drains (pure: seeded)."""
    if num_programs < 1:
        raise ValueError(f"a burst needs at least one program, got {num_programs}")
    rng = random.Random(seed)
    return [_draw(rng, index, 0.0, mix, sizes) for index in range(num_programs)]
