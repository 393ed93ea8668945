"""The LangGraph recipes end to end on one embedded server, in both modes: compiled on
Eclectus gives what the eager app on Eclectus gives (greedy, one engine), and the stock run
over /v1 makes the same calls; the compiled run costs two client frames whatever the fan-out.

Stock and Eclectus text are not compared: Eclectus sends a prompt as segments, each
tokenized on its own (exact prefix-reuse points), while /v1 tokenizes one flat string, so a
BPE merge across a boundary (" ['") makes the greedy continuations differ."""

from __future__ import annotations

import pytest
from recipe_support import TEXT, run_three_modes

from eclectus.recipes import MultiAgentParams, PlanExecuteParams, run_recipe
from eclectus.recipes.embedded import Embedded
from eclectus.recipes.plan_execute import plan_steps

pytestmark = pytest.mark.slow

SMALL = dict(goal_tokens=32, plan_tokens=8, step_tokens=4, answer_tokens=8)
TEAM = MultiAgentParams(
    files=2, rounds=1, requirements_tokens=32, design_tokens=8, list_tokens=8, code_tokens=4,
    review_tokens=4,
)  # fmt: skip


@pytest.mark.parametrize("steps", [2, 5])
def test_plan_execute_both_modes_agree(embedded: Embedded, steps: int) -> None:
    """Compiled equals eager; steps + 2 calls in every mode; two frames compiled, at any
    width."""
    params = PlanExecuteParams(steps=steps, **SMALL)
    ours, eager, stock = run_three_modes(embedded, "plan-execute", params)
    assert ours.output == eager.output and ours.output and stock.output
    assert eager.num_calls == steps + 2
    assert ours.num_calls == stock.num_calls == steps + 2
    assert ours.details["client frames"] == 2
    assert stock.details["client round trips"] == steps + 2
    assert ours.notes == []


def test_multi_agent_graph_matches_the_chain_recipe(embedded: Embedded) -> None:
    """The LangGraph team makes the LCEL team's calls and writes the same files; stock makes
    the same calls."""
    graph = run_recipe("multi-agent-graph", TEAM, embedded.target("eclectus"), text=TEXT)
    stock = run_recipe("multi-agent-graph", TEAM, embedded.target("openai"), text=TEXT)
    chain = run_recipe("multi-agent", TEAM, embedded.target("eclectus"), text=TEXT)
    assert graph.output == chain.output and stock.output
    assert graph.num_calls == chain.num_calls == stock.num_calls == 2 + 2 * 3
    assert graph.details["client frames"] == 2


def test_plan_steps_pads_and_truncates() -> None:
    """Numbered lines are the steps; a plan without any is padded."""
    assert plan_steps("1. dig\n2) fill\n- rake\nnoise", 2) == ["dig", "fill"]
    assert plan_steps("", 2) == ["step 1", "step 2"]
    assert plan_steps("just words", 2) == ["just words", "step 2"]
