"""The ``tool-agent`` recipe (a LangGraph ReAct loop with ToolNode) runs to completion on the
tiny model in every mode: compiled on Eclectus gives what the eager app gives, and the
stock run over /v1 makes the same calls with the same tools."""

from __future__ import annotations

import pytest
from recipe_support import run_three_modes

from eclectus.recipes import ToolAgentParams
from eclectus.recipes.embedded import Embedded
from eclectus.recipes.tool_agent import make_tools

pytestmark = pytest.mark.slow

SMALL = dict(question_tokens=16, tool_tokens=48, answer_tokens=8)


@pytest.mark.parametrize("rounds", [0, 3])
def test_tool_agent_runs_in_every_mode(embedded: Embedded, rounds: int) -> None:
    """rounds forced tool calls, then the answer: rounds + 1 calls in every mode; the
    compiled run equals the eager one."""
    params = ToolAgentParams(tool_rounds=rounds, **SMALL)
    ours, eager, stock = run_three_modes(embedded, "tool-agent", params)
    assert ours.output == eager.output and ours.output and stock.output
    # rounds + 1 when every forced call closes within tool_tokens; a call tiny runs to the
    # budget parses as no tool call and the loop asks again, as it does on stock vLLM (the
    # budget guarantee is opt-in): the same calls in every mode either way
    assert ours.num_calls == eager.num_calls == stock.num_calls >= rounds + 1
    for result in (ours, eager, stock):
        assert result.details["tool calls"] == rounds
        # what the server (or the callbacks) counted is what the app's state holds
        assert result.num_calls == result.details["model turns"]
    if rounds >= 2:
        assert ours.details["tools used"] == stock.details["tools used"] == "lookup, count_words"
    # with tool turns before it, the answer's prompt holds tool calls: it runs on the
    # client too (exact), so every call is a round trip; without, it is the one frame
    assert ours.details["calls run on the client"] == (ours.num_calls if rounds else 0)
    if not rounds:
        assert ours.details["client frames"] == 1
    assert ours.notes == []


def test_the_tools_read_the_document() -> None:
    """lookup finds the sentences naming a term; count_words counts."""
    lookup, count_words = make_tools("Owls hunt at night. Ducks swim. Owls hoot.", 5)
    assert lookup.invoke({"term": "owls"}) == "Owls hunt at night.\nOwls hoot."
    assert lookup.invoke({"term": "bats"}) == "No sentence mentions 'bats'."
    assert count_words.invoke({"text": "a b  c"}) == 3


def test_without_retries_a_failed_call_counts_as_its_round(embedded: Embedded) -> None:
    """retry_failed_calls=False: a forced call tiny runs to its budget unclosed is its
    round, so every mode makes exactly rounds + 1 calls (with retries this input makes
    more: test_tool_agent_runs_in_every_mode)."""
    params = ToolAgentParams(tool_rounds=3, retry_failed_calls=False, **SMALL)
    ours, eager, stock = run_three_modes(embedded, "tool-agent", params)
    assert ours.output == eager.output and stock.output
    for result in (ours, eager, stock):
        assert result.num_calls == result.details["model turns"] == 4
    # this input's first forced call runs to the budget: fewer calls than rounds
    assert ours.details["tool calls"] == eager.details["tool calls"] == stock.details["tool calls"]
    assert ours.details["tool calls"] < 3
