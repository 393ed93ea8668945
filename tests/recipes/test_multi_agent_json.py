"""The ``multi-agent-json`` recipe: the team's file list as constrained JSON, each engineer's
draft/review/revise pipeline fanned out per name on the server. Compiled equals eager, the
stock run over /v1 makes the same calls and writes as many files, and a compiled run is one
client frame whatever the team's size."""

from __future__ import annotations

import json

import pytest
from recipe_support import run_three_modes

from eclectus.recipes import MultiAgentParams
from eclectus.recipes.embedded import Embedded
from eclectus.recipes.multi_agent_json import NAME_CHARS, files_schema, list_budget

pytestmark = pytest.mark.slow

SMALL = dict(requirements_tokens=32, design_tokens=8, list_tokens=8, code_tokens=4)


@pytest.mark.parametrize(
    ("files", "rounds"),
    [(2, 1), (3, 0), (2, 2)],
)
def test_multi_agent_json_maps_the_team_on_the_server(
    embedded: Embedded, files: int, rounds: int
) -> None:
    """2 + files x (1 + 2 rounds) calls in every mode; compiled == eager; one frame."""
    params = MultiAgentParams(files=files, rounds=rounds, review_tokens=4, **SMALL)
    ours, eager, stock = run_three_modes(embedded, "multi-agent-json", params)
    assert ours.output == eager.output and ours.output and stock.output
    calls = 2 + files * (1 + 2 * rounds)
    assert ours.num_calls == eager.num_calls == stock.num_calls == calls
    assert ours.details["files"].count(", ") == files - 1
    assert ours.details["client frames"] == 1
    assert stock.details["client round trips"] == calls
    assert ours.notes == []


def test_the_list_fits_its_budget() -> None:
    """The longest compact list the schema allows fits the list call's max_tokens, a token a
    character at worst (names are ASCII by the schema's pattern). Compact is xgrammar's
    separators, a space after each ``,`` and ``:``, as ``json.dumps`` writes them."""
    params = MultiAgentParams(files=8, list_tokens=4)
    longest = json.dumps({"files": ["x" * NAME_CHARS] * 8})
    assert len(longest) <= list_budget(params)
    assert files_schema(8)["properties"]["files"]["minItems"] == 8
