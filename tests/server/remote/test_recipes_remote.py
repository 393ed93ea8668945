"""Every recipe runs against ``eclectus serve --engine-url``: the real CLI in front of two
real ``eclectus serve`` engine processes, each recipe at a small size through the runner
API (what ``eclectus run NAME --server URL`` calls), in Eclectus mode and in openai mode
(the front server's own /v1)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from remote_helpers import STARTUP_TIMEOUT_S, EngineProcess

from eclectus.recipes import (
    ChainSummaryParams,
    MapReduceParams,
    MultiAgentParams,
    PlanExecuteJsonParams,
    PlanExecuteParams,
    RecipeResult,
    SharedPromptParams,
    ToolAgentParams,
    run_recipe,
)
from eclectus.recipes.runner import RECIPES
from eclectus.recipes.target import Target

pytestmark = pytest.mark.slow

TEXT = " ".join(
    f"Paragraph {i} notes that the heron waits at the river bank while the {i}th boat "
    f"passes, and the keeper writes the time in a small red book."
    for i in range(40)
)
TEAM = MultiAgentParams(
    files=2, rounds=1, requirements_tokens=32, design_tokens=8, list_tokens=8, code_tokens=4,
    review_tokens=4,
)  # fmt: skip
SIZES: dict[str, Any] = {
    "map-reduce": MapReduceParams(chunk_tokens=64, num_chunks=3, map_tokens=8, reduce_tokens=8),
    "chain-summary": ChainSummaryParams(chunk_tokens=64, num_chunks=2, summary_tokens=8),
    "multi-agent": TEAM,
    "shared-prompt": SharedPromptParams(
        users=2,
        requests=3,
        rate=50.0,
        system_tokens=128,
        answer_tokens=8,
        background=MapReduceParams(chunk_tokens=64, num_chunks=2, map_tokens=8, reduce_tokens=8),
    ),
    "plan-execute": PlanExecuteParams(
        steps=2, goal_tokens=32, plan_tokens=8, step_tokens=4, answer_tokens=8
    ),
    "multi-agent-graph": TEAM,
    "multi-agent-json": TEAM,
    "plan-execute-json": PlanExecuteJsonParams(
        steps=2, goal_tokens=32, plan_tokens=8, step_chars=6, step_tokens=4, answer_tokens=8
    ),
    "tool-agent": ToolAgentParams(
        tool_rounds=1, question_tokens=16, tool_tokens=48, answer_tokens=8
    ),
}
# the function-style forms (recipes/functions.py) run at their LCEL forms' sizes
SIZES.update({f"{n}-fn": SIZES[n] for n in ("map-reduce", "chain-summary", "multi-agent")})
SIZES["plan-execute-fn"] = SIZES["plan-execute"]


@pytest.fixture(scope="module")
def front(engines: list[EngineProcess]) -> Iterator[tuple[str, str]]:
    """``eclectus serve --model tiny --engine-url A --engine-url B``: its ws:// URL and its
    http:// root."""
    flags = ["--engine-url", engines[0].url, "--engine-url", engines[1].url]
    command = [sys.executable, "-m", "eclectus", "serve", "--model", "tiny", "--port", "0"]
    proc = subprocess.Popen([*command, *flags], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:  # read stderr to the end, so the server never blocks on it
        assert proc.stderr is not None
        for line in proc.stderr:
            match = re.search(r"on (ws://\S+)", line)
            if match and not found:
                found.append(match.group(1).rstrip(")"))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        assert ready.wait(STARTUP_TIMEOUT_S) and found, "the front server never started"
        url = found[0]
        yield url, "http://" + url.removeprefix("ws://").split("/", 1)[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_sizes_cover_every_recipe() -> None:
    assert set(SIZES) == set(RECIPES)


def generated_tokens(engines: list[EngineProcess]) -> float:
    """Tokens the engine processes generated in all, from their own /metrics."""
    total = 0.0
    for engine in engines:
        page = httpx.get(engine.url.removesuffix("/v1") + "/metrics", timeout=30).text
        match = re.search(r"^eclectus_generated_tokens_total (\S+)$", page, re.MULTILINE)
        assert match, "an engine reports no generated tokens"
        total += float(match.group(1))
    return total


@pytest.mark.parametrize("name", list(SIZES))
def test_recipe_runs_through_remote_engines(
    engines: list[EngineProcess], front: tuple[str, str], name: str
) -> None:
    """The recipe completes through the front server in both modes, makes the same number
    of calls in each, and produces output; the engine processes generated it."""
    ws_url, root = front
    before = generated_tokens(engines)
    metrics = f"{root}/metrics"
    ours: RecipeResult = run_recipe(
        name, SIZES[name], Target("eclectus", ws_url, metrics_url=metrics), text=TEXT
    )
    stock: RecipeResult = run_recipe(
        name, SIZES[name], Target("openai", f"{root}/v1", metrics_url=metrics), text=TEXT
    )
    assert ours.output.strip() and stock.output.strip()
    assert ours.num_calls == stock.num_calls > 0, (ours.notes, stock.notes)
    assert generated_tokens(engines) > before
