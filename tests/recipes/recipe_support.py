"""Shared test input and runs for the recipe tests."""

from __future__ import annotations

from typing import Any

from eclectus.recipes import MultiAgentParams, RecipeResult, run_recipe
from eclectus.recipes.embedded import Embedded

# A small document: enough for several 64-token chunks.
TEXT = " ".join(
    f"Paragraph {i} notes that the heron waits at the river bank while the {i}th boat "
    f"passes, and the keeper writes the time in a small red book."
    for i in range(40)
)

# A two-engineer team with short outputs: every part of the multi-agent graph, quickly.
SMALL_TEAM = MultiAgentParams(
    files=2,
    rounds=1,
    requirements_tokens=64,
    design_tokens=8,
    list_tokens=8,
    code_tokens=8,
    review_tokens=8,
)


def run_three_modes(
    embedded: Embedded, name: str, params: Any
) -> tuple[RecipeResult, RecipeResult, RecipeResult]:
    """Recipe ``name`` over TEXT compiled on Eclectus, eager on Eclectus, and stock over
    /v1, in that order."""
    return (
        run_recipe(name, params, embedded.target("eclectus"), text=TEXT),
        run_recipe(name, params, embedded.target("eclectus", False), text=TEXT),
        run_recipe(name, params, embedded.target("openai"), text=TEXT),
    )
