"""Every recipe answers on Eclectus (its graph, compiled, the built-in engine) what the same
app answers the stock way on stock vLLM, at temperature 0: the same final output. Kept out
of CI: set ``VLLM_PYTHON`` to the python of a vllm install (docs/evals.md); run by hand."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai._base_client as openai_client
import pytest

from eclectus.evals.budget import Budget
from eclectus.evals.servers import VllmProcess
from eclectus.evals.workloads import quick_workloads
from eclectus.models.presets import resolve_model_dir
from eclectus.recipes.embedded import Embedded, embedded_server
from eclectus.recipes.runner import RECIPES, run_recipe
from eclectus.recipes.target import Target
from eclectus.server.engine import EngineConfig

VLLM_PYTHON = os.environ.get("VLLM_PYTHON")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PYTHON, reason="set VLLM_PYTHON to a vllm install's python"),
]


class ToolCallingVllm(VllmProcess):
    """Stock vLLM as a tool-using app needs it: named tool choice wants a parser."""

    def command(self) -> list[str]:
        return [*super().command(), "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmProcess]:
    assert VLLM_PYTHON is not None
    log = Path(tmp_path_factory.mktemp("vllm")) / "server-vllm.log"
    model_dir = resolve_model_dir("tiny")
    server = ToolCallingVllm("vllm", model_dir, Budget(), log, python=VLLM_PYTHON)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def eclectus() -> Iterator[Embedded]:
    """The built-in engine with the JSON layout of the vLLM above (``VllmProcess`` runs it
    with ``disable_any_whitespace``): ``--compact-json``, as the evals pair them."""
    with embedded_server("tiny", EngineConfig(model="tiny", json_whitespace="compact")) as running:
        yield running


def params_of(name: str) -> object:
    """The eval's quick sizes where it has them, else the recipe's defaults (pure)."""
    quick = {w.recipe: w.base for w in quick_workloads().values()}
    params = quick.get(name)
    return RECIPES[name].params_type() if params is None else dataclasses.replace(params)


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_recipe_answers_as_on_stock_vllm(
    name: str, vllm: VllmProcess, eclectus: Embedded
) -> None:
    params = params_of(name)
    ours = run_recipe(name, params, eclectus.target("eclectus"))
    stock = run_recipe(name, params, Target("openai", vllm.openai_url, "tiny"))
    assert ours.output == stock.output


def test_tool_agents_requests_get_the_same_token_ids(
    vllm: VllmProcess, eclectus: Embedded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tool-agent's model calls, compared where the model is (the app result above could
    hide a difference that two parses absorb): every chat request the app sends stock vLLM,
    sent again with ``return_token_ids`` to that vLLM and to Eclectus's /v1, gets the same
    prompt ids and the same generated ids on both (forced strict tool calls included)."""
    bodies: list[dict[str, Any]] = []
    build = openai_client.BaseClient._build_request

    def recording(self: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        if str(options.url).endswith("/chat/completions"):
            bodies.append(dict(options.json_data))
        return build(self, options, *args, **kwargs)

    monkeypatch.setattr(openai_client.BaseClient, "_build_request", recording)
    run_recipe("tool-agent", params_of("tool-agent"), Target("openai", vllm.openai_url, "tiny"))
    monkeypatch.undo()
    assert sum("tool_choice" in b for b in bodies) >= 3  # the forced rounds were sent
    for body in bodies:
        replies = [
            httpx.post(
                f"{url}/chat/completions", json={**body, "return_token_ids": True}, timeout=600
            )
            .raise_for_status()
            .json()
            for url in (vllm.openai_url, eclectus.openai_url)
        ]
        stock, ours = replies
        assert ours["prompt_token_ids"] == stock["prompt_token_ids"]
        assert ours["choices"][0]["token_ids"] == stock["choices"][0]["token_ids"]
