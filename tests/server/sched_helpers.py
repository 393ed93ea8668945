"""Drive the scheduler directly (no socket) for unit tests of graph and dispatch decisions."""

from __future__ import annotations

import asyncio
from typing import Any

from scripted_engine import FRONT, ScriptedEngine

from eclectus.protocol import Submit
from eclectus.server.config import ServerConfig
from eclectus.server.front.metrics import Metrics
from eclectus.server.graph.fragment import stage
from eclectus.server.graph.objectives import objective_for_get
from eclectus.server.graph.scheduler import AppState, GraphScheduler


class FakeClock:
    """A clock tests move by hand, so aging and deadlines are deterministic."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_scheduler(
    engine: ScriptedEngine | None = None, clock: FakeClock | None = None, **config: Any
) -> GraphScheduler:
    return GraphScheduler(
        engine or ScriptedEngine(),
        ServerConfig(port=0, **config),
        Metrics(),
        clock or FakeClock(),
        front=FRONT,
    )


def submit(sched: GraphScheduler, app: AppState, **frame: Any) -> None:
    """Validate and add a fragment, then run its gets (as the session would)."""
    fragment = Submit(**frame)
    staged = stage(app.graph, fragment, sched.config, lambda t: len(t.encode()))
    app.graph.add(staged.variables, staged.nodes)
    for get in fragment.gets:
        objective = objective_for_get(get.criteria, get.deadline_ms, sched.clock())
        sched.activate(app, get.var, objective)


def call(call_id: str, out: str, *inputs: str, text: str = "", max_tokens: int = 8) -> dict:
    """A one-output call spec: ``text`` then each input then the output."""
    segments: list[dict] = [{"text": f"{text or call_id}:"}]
    segments += [{"var": v} for v in inputs]
    segments.append({"gen": out, "sampling": {"max_tokens": max_tokens}})
    return {"id": call_id, "segments": segments}


async def drain(sched: GraphScheduler, rounds: int = 200) -> None:
    """Let the loop run until nothing is queued or in flight."""
    for _ in range(rounds):
        await asyncio.sleep(0)
        if not sched.ready and sched.num_inflight == 0:
            return
    raise AssertionError(f"scheduler still busy: {sched.gauges()}")


def order(sched: GraphScheduler) -> list[str]:
    """Node ids in dispatch order."""
    return [node_id for _, node_id in sched.dispatch_log]
