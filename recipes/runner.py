"""``run_recipe``: one recipe, one target, measured.

Counters come from the server's /metrics before and after the run (a delta), in both modes
when the server is Eclectus; against a foreign OpenAI-compatible server, calls are counted on
the client and the prefix-cache hit ratio is unknown. Runs on one server should not overlap:
the delta would count both.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eclectus.recipes import (
    chain_summary,
    functions,
    map_reduce,
    multi_agent,
    multi_agent_graph,
    multi_agent_json,
    plan_execute,
    plan_execute_json,
    shared_prompt,
    tool_agent,
)
from eclectus.recipes.embedded import embedded_server
from eclectus.recipes.observe import CallObserver, ServerDelta, ServerProgress, scrape
from eclectus.recipes.result import RecipeOutput, RecipeResult
from eclectus.recipes.target import ModelFactory, Target
from eclectus.recipes.text import load_sample


@dataclass(frozen=True, slots=True)
class RecipeSpec:
    """A registered recipe: its params type, planner, app function and default sample."""

    params_type: type
    plan: Callable[[Any, str], int]  # (params, text) -> planned model calls
    run: Callable[..., RecipeOutput]  # (params, models, text, config) -> output
    sample: str


RECIPES: dict[str, RecipeSpec] = {
    "map-reduce": RecipeSpec(
        map_reduce.MapReduceParams, map_reduce.plan, map_reduce.run, "field-guide"
    ),
    "chain-summary": RecipeSpec(
        chain_summary.ChainSummaryParams, chain_summary.plan, chain_summary.run, "history-essay"
    ),
    "multi-agent": RecipeSpec(
        multi_agent.MultiAgentParams, multi_agent.plan, multi_agent.run, "design-note"
    ),
    "shared-prompt": RecipeSpec(
        shared_prompt.SharedPromptParams, shared_prompt.plan, shared_prompt.run, "field-guide"
    ),
    # LangGraph apps (compiled with eclectus.adapters.langgraph in Eclectus mode)
    "plan-execute": RecipeSpec(
        plan_execute.PlanExecuteParams, plan_execute.plan, plan_execute.run, "field-guide"
    ),
    "multi-agent-graph": RecipeSpec(
        multi_agent.MultiAgentParams, multi_agent.plan, multi_agent_graph.run, "design-note"
    ),
    "multi-agent-json": RecipeSpec(
        multi_agent.MultiAgentParams, multi_agent.plan, multi_agent_json.run, "design-note"
    ),
    "plan-execute-json": RecipeSpec(
        plan_execute_json.PlanExecuteJsonParams,
        plan_execute_json.plan,
        plan_execute_json.run,
        "field-guide",
    ),
    "tool-agent": RecipeSpec(
        tool_agent.ToolAgentParams, tool_agent.plan, tool_agent.run, "field-guide"
    ),
    # function style: the same apps as plain Python (compiled with the Python evaluator)
    "map-reduce-fn": RecipeSpec(
        map_reduce.MapReduceParams, map_reduce.plan, functions.map_reduce_run, "field-guide"
    ),
    "chain-summary-fn": RecipeSpec(
        chain_summary.ChainSummaryParams,
        chain_summary.plan,
        functions.chain_summary_run,
        "history-essay",
    ),
    "multi-agent-fn": RecipeSpec(
        multi_agent.MultiAgentParams, multi_agent.plan, functions.multi_agent_run, "design-note"
    ),
    "plan-execute-fn": RecipeSpec(
        plan_execute.PlanExecuteParams,
        plan_execute.plan,
        functions.plan_execute_run,
        "field-guide",
    ),
}


def run_recipe(
    name: str,
    params: Any = None,
    target: Target | None = None,
    *,
    text: str | None = None,
    model: str = "tiny",
    temperature: float = 0.0,
    progress: bool = False,
) -> RecipeResult:
    """Run recipe ``name`` with ``params`` (its params dataclass; None: defaults) on
    ``target`` (None: an embedded Eclectus server for ``model``, started and stopped here)
    over ``text`` (None: the recipe's bundled sample). Greedy unless ``temperature`` says
    otherwise. ``progress`` prints calls finished / planned to stderr."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    spec = RECIPES[name]
    params = spec.params_type() if params is None else params
    if not isinstance(params, spec.params_type):
        raise TypeError(f"{name} takes {spec.params_type.__name__}, got {type(params).__name__}")
    text = load_sample(spec.sample) if text is None else text
    if target is None:
        with embedded_server(model) as embedded:
            return _measured(
                name, spec, params, embedded.target("eclectus"), text, temperature, progress
            )
    return _measured(name, spec, params, target, text, temperature, progress)


def _measured(
    name: str,
    spec: RecipeSpec,
    params: Any,
    target: Target,
    text: str,
    temperature: float,
    progress: bool,
) -> RecipeResult:
    models = ModelFactory(target, temperature=temperature)
    observer = CallObserver(spec.plan(params, text), name, show=progress)
    before = scrape(target.metrics_url) if target.metrics_url else None
    polling = (
        ServerProgress(target.metrics_url, observer)
        if target.metrics_url and progress and target.backend == "eclectus"
        else contextlib.nullcontext()
    )
    started = time.perf_counter()
    with polling:
        out = spec.run(params, models, text, {"callbacks": [observer], "run_name": name})
        wall_s = time.perf_counter() - started
    observer.print_progress(final=True)
    notes = list(models.notes)
    if before is not None:
        delta = ServerDelta.between(before, scrape(target.metrics_url))  # type: ignore[arg-type]
        # The OpenAI endpoint bypasses the graph scheduler: count its calls on the client.
        calls = delta.calls if target.backend == "eclectus" else observer.num_calls
        ratio, counters = delta.cache_hit_ratio, delta.counters
    else:
        calls, ratio, counters = observer.num_calls, None, {}
        notes.append("prefix-cache hit ratio unknown: the server is not Eclectus")
    return RecipeResult(
        name=name,
        backend=target.backend,
        model=target.model,
        output=out.output,
        wall_s=wall_s,
        num_calls=calls,
        depth=out.depth,
        cache_hit_ratio=ratio,
        details=out.details,
        server_counters=counters,
        timeline=list(observer.spans),
        notes=notes,
    )
