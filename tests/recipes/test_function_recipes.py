"""The recipes in function style (recipes/functions.py): plain Python orchestrating the LCEL
forms' calls. Compiled, each equals its LCEL form and its own eager run, in the frames the
LCEL form takes (one per decision on model output, plus one)."""

from __future__ import annotations

from typing import Any

import pytest

from eclectus.recipes import (
    ChainSummaryParams,
    MapReduceParams,
    MultiAgentParams,
    PlanExecuteParams,
    run_recipe,
)
from eclectus.recipes.embedded import Embedded

PARAMS: dict[str, Any] = {
    "map-reduce": MapReduceParams(
        num_chunks=5, chunk_tokens=256, map_tokens=8, reduce_tokens=8, context_tokens=60
    ),  # a collapse level: 5 maps, 3 collapses (groups of 2), the reduce
    "chain-summary": ChainSummaryParams(num_chunks=3, chunk_tokens=256, summary_tokens=8),
    "multi-agent": MultiAgentParams(
        files=3,
        rounds=1,
        requirements_tokens=256,
        design_tokens=8,
        list_tokens=8,
        code_tokens=8,
        review_tokens=8,
    ),
    "plan-execute": PlanExecuteParams(
        steps=3, goal_tokens=128, plan_tokens=16, step_tokens=8, answer_tokens=8
    ),
}
FRAMES = {"map-reduce": 1, "chain-summary": 1, "multi-agent": 2, "plan-execute": 2}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_a_function_recipe_equals_its_lcel_form(embedded: Embedded, name: str) -> None:
    params = PARAMS[name]
    lcel = run_recipe(name, params, embedded.target("eclectus"))
    compiled = run_recipe(f"{name}-fn", params, embedded.target("eclectus"))
    eager = run_recipe(f"{name}-fn", params, embedded.target("eclectus", use_compile=False))
    assert compiled.output == lcel.output == eager.output
    assert compiled.num_calls == lcel.num_calls == eager.num_calls
    assert compiled.details["client frames"] == FRAMES[name]
    assert eager.details["client round trips"] == eager.num_calls
    assert not compiled.notes


def test_a_function_recipe_runs_the_stock_way(embedded: Embedded) -> None:
    """openai mode: the same function, uncompiled, over langchain_openai."""
    params = PARAMS["chain-summary"]
    stock = run_recipe("chain-summary-fn", params, embedded.target("openai"))
    assert stock.num_calls == 3 and stock.details["client round trips"] == 3
