"""The ``plan-execute-json`` recipe: a constrained JSON plan fanned out on the server. Compiled
equals eager, the stock run over /v1 makes the same calls, and a compiled run is one client
frame whatever the number of steps."""

from __future__ import annotations

import pytest
from recipe_support import run_three_modes

from eclectus.recipes import PlanExecuteJsonParams
from eclectus.recipes.embedded import Embedded

pytestmark = pytest.mark.slow

SMALL = dict(goal_tokens=32, plan_tokens=8, step_chars=6, step_tokens=4, answer_tokens=8)


@pytest.mark.parametrize("steps", [2, 5])
def test_plan_execute_json_maps_on_the_server(embedded: Embedded, steps: int) -> None:
    """steps + 2 calls in every mode; compiled == eager; one frame compiled, at any width."""
    params = PlanExecuteJsonParams(steps=steps, **SMALL)
    ours, eager, stock = run_three_modes(embedded, "plan-execute-json", params)
    assert ours.output == eager.output and ours.output and stock.output
    assert ours.num_calls == eager.num_calls == stock.num_calls == steps + 2
    assert ours.details["client frames"] == 1
    assert stock.details["client round trips"] == steps + 2
    assert ours.notes == []


@pytest.mark.parametrize("steps", [2, 5])
def test_a_triage_router_routes_on_the_server(embedded: Embedded, steps: int) -> None:
    """With ``triage``, a supervisor constrained to "brief"/"detailed" picks the planner:
    compiled it is a server switch, still one frame (each branch's planner, map and
    synthesizer declared; only the taken one runs: steps + 3 calls in every mode)."""
    params = PlanExecuteJsonParams(steps=steps, triage=True, **SMALL)
    ours, eager, stock = run_three_modes(embedded, "plan-execute-json", params)
    assert ours.output == eager.output and ours.output and stock.output
    assert ours.details["style"] == eager.details["style"] in ("brief", "detailed")
    assert ours.num_calls == eager.num_calls == stock.num_calls == steps + 3
    assert ours.details["client frames"] == 1
    assert stock.details["client round trips"] == steps + 3
    assert ours.notes == []
