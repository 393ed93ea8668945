"""The eval workloads: a recipe, its base sizes, and the parameters swept, after the paper.

Each sweep varies one field of the recipe's params dataclass (a dotted path reaches nested
params, e.g. ``background.chunk_tokens``). ``full`` sizes are the documented defaults of
``eclectus eval``; ``quick`` sizes finish the whole workload in minutes on a 2-core CPU with
the ``tiny`` model. ``--set`` and ``--sweep`` override both (CI uses them to shrink further);
their values are parsed by each field's declared type, as ``eclectus run --param`` parses
them (:mod:`eclectus.recipes.params`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from eclectus.recipes import (
    ChainSummaryParams,
    MapReduceParams,
    MultiAgentParams,
    PlanExecuteParams,
    SharedPromptParams,
)
from eclectus.recipes.params import parse_field, replace_path, set_from_text

__all__ = [  # replace_path is the recipes' own, re-exported for the harness
    "CHAT_LATENCY",
    "RTT_FIELD",
    "Sweep",
    "Workload",
    "full_workloads",
    "quick_workloads",
    "replace_path",
    "workload",
]

CHAT_LATENCY = "chat mean latency s"  # a shared-prompt detail: what its chat users feel
# A sweep over this pseudo-field varies the client round trip (ms) of every system, not a
# recipe parameter: the servers stay up across its points (vLLM takes minutes to start).
RTT_FIELD = "rtt_ms"
# the quick sizes of the StateGraph teams
QUICK_TEAM: dict[str, Any] = dict(
    files=4, requirements_tokens=256, design_tokens=16, list_tokens=16, code_tokens=16,
    review_tokens=8, width=8,
)  # fmt: skip
# the team of every multi-agent workload (the LCEL chain and both StateGraphs)
TEAM = MultiAgentParams(
    files=8, rounds=1, design_tokens=100, list_tokens=30, code_tokens=60, review_tokens=30,
    width=16,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Sweep:
    """One swept field and its values."""

    field: str  # dotted path into the params dataclass
    values: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    """A recipe run at ``base`` sizes, then at each value of each sweep.

    ``metric``: "wall_s" (the app's end-to-end time) or a key of the recipe's details.
    """

    name: str
    recipe: str
    base: Any
    sweeps: tuple[Sweep, ...]
    metric: str = "wall_s"
    description: str = ""


def _bg(chunk: int, num: int, out: int) -> MapReduceParams:
    return MapReduceParams(
        chunk_tokens=chunk, num_chunks=num, map_tokens=out, reduce_tokens=out, width=num
    )


# the recipes that have a function-style form (recipes/functions.py), measured as their
# LCEL forms are, at the round trips a client pays (the form's difference is frames)
FUNCTION_FORMS = ("map-reduce", "chain-summary", "multi-agent", "plan-execute")


def with_function_forms(table: dict[str, Workload], rtts: tuple[float, ...]) -> dict[str, Workload]:
    """``table`` and, for each of FUNCTION_FORMS, ``NAME-fn``: the same sizes, the function
    form of the recipe, swept over the client round trip (pure)."""
    forms = {
        f"{name}-fn": dataclasses.replace(
            table[name],
            name=f"{name}-fn",
            recipe=f"{name}-fn",
            sweeps=(Sweep(RTT_FIELD, rtts),),
            description=f"{table[name].description} (as plain Python: the function form)",
        )
        for name in FUNCTION_FORMS
    }
    return {**table, **forms}


def full_workloads() -> dict[str, Workload]:
    """The paper-shaped sizes (a representative subset of its sweeps; see docs/evals.md)."""
    return with_function_forms(_full_workloads(), (0.0, 100.0, 250.0))


def _full_workloads() -> dict[str, Workload]:
    return {
        w.name: w
        for w in (
            Workload(
                "chain-summary",
                "chain-summary",
                ChainSummaryParams(chunk_tokens=1024, num_chunks=4, summary_tokens=50),
                (Sweep("summary_tokens", (25, 50, 100)), Sweep("chunk_tokens", (512, 2048))),
                description="refine chain: every call waits for the previous summary",
            ),
            Workload(
                "map-reduce",
                "map-reduce",
                MapReduceParams(
                    chunk_tokens=1024, num_chunks=8, map_tokens=50, reduce_tokens=50, width=8
                ),
                (Sweep("map_tokens", (25, 50, 100)), Sweep("chunk_tokens", (512, 2048))),
                description="8 parallel maps, one reduce",
            ),
            Workload(
                "multi-agent",
                "multi-agent",
                TEAM,
                (Sweep("files", (4, 8, 16)),),
                description="architect, then one engineer per file sharing the design",
            ),
            Workload(
                "plan-execute",
                "plan-execute",
                PlanExecuteParams(
                    steps=8, goal_tokens=256, plan_tokens=64, step_tokens=32, answer_tokens=64
                ),
                (Sweep(RTT_FIELD, (0.0, 100.0, 250.0)), Sweep("steps", (4, 8, 16))),
                description="LangGraph: planner, one executor per step (Send), synthesizer",
            ),
            Workload(
                "multi-agent-graph",
                "multi-agent-graph",
                TEAM,
                (Sweep(RTT_FIELD, (0.0, 100.0, 250.0)), Sweep("files", (4, 8, 16))),
                description="LangGraph: architect, then one engineer per file (Send)",
            ),
            Workload(
                "multi-agent-json",
                "multi-agent-json",
                TEAM,
                (Sweep(RTT_FIELD, (0.0, 100.0, 250.0)), Sweep("files", (4, 8, 16))),
                description="LangGraph: the team with a JSON file list, mapped on the server",
            ),
            Workload(
                "shared-prompt",
                "shared-prompt",
                SharedPromptParams(
                    users=8,
                    requests=16,
                    rate=4.0,
                    system_tokens=2048,
                    answer_tokens=32,
                    background=None,
                ),
                (Sweep("rate", (2.0, 4.0, 8.0)),),
                metric=CHAT_LATENCY,
                description="chats sharing a 2k-token system prompt, Poisson arrivals",
            ),
            Workload(
                "mixed",
                "shared-prompt",
                SharedPromptParams(
                    users=8,
                    requests=16,
                    rate=2.0,
                    system_tokens=1024,
                    answer_tokens=32,
                    background=_bg(1024, 8, 50),
                    # a batch job beside the chats, after the paper's 9 map-reduce jobs
                    # beside 40 chats: two jobs kept running (a new one when one ends) from
                    # the first chat to the last answer, so the engine has background work
                    # all the while, however fast it is; one job's reduce, a single call,
                    # runs beside the other's maps
                    background_concurrency=2,
                    # background_concurrency=none: the open loop measured before 2026-12-01,
                    # one job starting each second of the 8 s the chats arrive over
                    background_jobs=8,
                ),
                (Sweep("rate", (1.0, 2.0, 4.0)),),
                metric=CHAT_LATENCY,
                description="chat sessions beside a batch of map-reduce jobs running throughout",
            ),
        )
    }


def quick_workloads() -> dict[str, Workload]:
    """Sizes for ``--quick``: the full workloads' shapes, a few hundred tokens, two sweep points."""
    full = _full_workloads()

    def shrink(name: str, sweep: Sweep, **sizes: Any) -> Workload:
        w = full[name]
        return dataclasses.replace(w, base=dataclasses.replace(w.base, **sizes), sweeps=(sweep,))

    table = {
        "chain-summary": shrink(
            "chain-summary",
            Sweep("summary_tokens", (8, 16)),
            chunk_tokens=256,
            num_chunks=3,
            summary_tokens=16,
        ),
        "map-reduce": shrink(
            "map-reduce",
            Sweep("map_tokens", (8, 16)),
            chunk_tokens=256,
            num_chunks=4,
            map_tokens=16,
            reduce_tokens=16,
            width=4,
        ),
        "multi-agent": shrink(
            "multi-agent",
            Sweep("files", (2, 4)),
            files=2,
            requirements_tokens=256,
            design_tokens=16,
            list_tokens=16,
            code_tokens=16,
            review_tokens=8,
            width=4,
        ),
        "plan-execute": shrink(
            "plan-execute",
            Sweep(RTT_FIELD, (0.0, 100.0)),
            steps=4,
            goal_tokens=128,
            plan_tokens=16,
            step_tokens=8,
            answer_tokens=8,
        ),
        "multi-agent-graph": shrink(
            "multi-agent-graph", Sweep(RTT_FIELD, (0.0, 100.0)), **QUICK_TEAM
        ),
        "multi-agent-json": shrink(
            "multi-agent-json", Sweep(RTT_FIELD, (0.0, 100.0)), **QUICK_TEAM
        ),
        "shared-prompt": shrink(
            "shared-prompt",
            Sweep("rate", (4.0, 16.0)),
            users=4,
            requests=4,
            rate=8.0,
            system_tokens=512,
            answer_tokens=8,
        ),
        "mixed": shrink(
            "mixed",
            Sweep("rate", (4.0, 16.0)),
            users=4,
            requests=4,
            rate=8.0,
            system_tokens=256,
            answer_tokens=8,
            background=_bg(256, 3, 8),
            background_jobs=2,
        ),
    }
    return with_function_forms(table, (0.0, 100.0))


def _sweep(base: Any, path: str, text: str) -> Sweep:
    """The sweep ``path`` = "v1,v2", each value parsed by the field's declared type and
    tried on ``base``, so a bad value fails here rather than mid-run (pure). ``rtt_ms``
    takes round trips in milliseconds, each >= 0."""
    if path == RTT_FIELD:
        return Sweep(path, tuple(_rtt(v) for v in text.split(",")))
    values = tuple(parse_field(type(base), path, v) for v in text.split(","))
    for value in values:
        replace_path(base, path, value)  # validates: unknown field, None on the way, bounds
    return Sweep(path, values)


def _rtt(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{RTT_FIELD} takes milliseconds, got {text!r}") from None
    if not value >= 0:
        raise ValueError(f"{RTT_FIELD} must be >= 0, got {text!r}")
    return value


def workload(name: str, quick: bool, overrides: dict[str, str], sweeps: dict[str, str]) -> Workload:
    """Workload ``name`` at quick or full sizes, with ``--set`` ``overrides`` (path -> text)
    applied to its base and ``--sweep`` ``sweeps`` (path -> "v1,v2") replacing its sweeps
    (pure; ValueError naming the workload and the field for an unknown name or field or a
    value of the wrong type)."""
    table = quick_workloads() if quick else full_workloads()
    if name not in table:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(table)}")
    chosen = table[name]
    try:
        base = chosen.base
        for path, text in overrides.items():
            base = set_from_text(base, path, text)
        swept = tuple(_sweep(base, p, t) for p, t in sweeps.items()) or chosen.sweeps
    except (TypeError, ValueError) as exc:
        raise ValueError(f"workload {name}: {exc}") from exc
    return dataclasses.replace(chosen, base=base, sweeps=swept)
