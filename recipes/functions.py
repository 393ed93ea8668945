"""The recipes in function style: the same apps, prompts and calls as their LCEL forms, the
orchestration written as plain Python, as most apps are.

- ``map-reduce-fn``: ``await mapper.abatch(...)``, collapse groups in a ``while`` loop
  (``"\\n\\n".join``), ``await reducer.ainvoke(...)``;
- ``chain-summary-fn``: a ``for`` loop refining the summary chunk by chunk;
- ``multi-agent-fn``: the architect's design and file list, the names read in Python
  (``file_names``: a regex over the list, so one graph break), a ``batch`` per round;
- ``plan-execute-fn``: plan-and-execute as a StateGraph of Python function nodes (planner,
  executor, synthesizer; the fan-out a function reading the plan: one break).

In Eclectus mode the function is compiled with ``eclectus.adapters.langchain.compile`` (a
graph with ``eclectus.adapters.langgraph.compile``): its model calls, joins and loops run
as one server graph, one frame per break plus one. In openai mode it runs as it is.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import set_config_context
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from eclectus.recipes import chain_summary, map_reduce, multi_agent, plan_execute
from eclectus.recipes.graphs import frame_details, prepare_graph
from eclectus.recipes.result import RecipeOutput
from eclectus.recipes.target import ModelFactory
from eclectus.recipes.text import split_chunks

LIST_BODY = "{summaries}"


def map_reduce_run(
    params: map_reduce.MapReduceParams, models: ModelFactory, text: str, config: RunnableConfig
) -> RecipeOutput:
    """map-reduce as an async app function (the LCEL form's prompts and calls)."""
    parser = StrOutputParser()
    mapper = PromptTemplate.from_template(map_reduce.MAP_PROMPT) | models.llm(params.map_tokens)
    mapper = mapper | parser
    collapse = map_reduce.COLLAPSE_HEAD + LIST_BODY + map_reduce.LIST_TAIL
    collapser = PromptTemplate.from_template(collapse) | models.llm(params.map_tokens) | parser
    reduce = map_reduce.REDUCE_HEAD + LIST_BODY + map_reduce.LIST_TAIL
    reducer = PromptTemplate.from_template(reduce) | models.llm(params.reduce_tokens) | parser
    per_group = map_reduce.group_size(params)
    width = {"max_concurrency": params.width}

    async def summarize(chunks: list[str]) -> str:
        summaries = await mapper.abatch([{"text": chunk} for chunk in chunks], width)
        while len(summaries) > per_group:
            groups = [summaries[i : i + per_group] for i in range(0, len(summaries), per_group)]
            inputs = [{"summaries": "\n\n".join(group)} for group in groups]
            summaries = await collapser.abatch(inputs, width)
        return await reducer.ainvoke({"summaries": "\n\n".join(summaries)})

    chunks = split_chunks(text, params.chunk_tokens, params.num_chunks)
    app = models.prepare_function(summarize, "map-reduce-fn")
    with set_config_context(config) as context:
        summary = context.run(_run_async, app, chunks)
    calls, depth = map_reduce.planned_calls(params, len(chunks))
    details = {"chunks": len(chunks), **frame_details(app, calls)}
    return RecipeOutput(summary, depth, calls, details)


def chain_summary_run(
    params: chain_summary.ChainSummaryParams,
    models: ModelFactory,
    text: str,
    config: RunnableConfig,
) -> RecipeOutput:
    """chain-summary as a loop (the LCEL form's prompts and calls)."""
    llm, parser = models.llm(params.summary_tokens), StrOutputParser()
    initial = PromptTemplate.from_template(chain_summary.INITIAL_PROMPT) | llm | parser
    refine = PromptTemplate.from_template(chain_summary.REFINE_PROMPT) | llm | parser

    def summarize(chunks: list[str]) -> str:
        summary = initial.invoke({"text": chunks[0]})
        for chunk in chunks[1:]:
            summary = refine.invoke({"summary": summary, "text": chunk})
        return summary

    chunks = split_chunks(text, params.chunk_tokens, params.num_chunks)
    app = models.prepare_function(summarize, "chain-summary-fn")
    with set_config_context(config) as context:
        summary = context.run(app, chunks)
    details = {"chunks": len(chunks), **frame_details(app, len(chunks))}
    return RecipeOutput(summary, len(chunks), len(chunks), details)


def multi_agent_run(
    params: multi_agent.MultiAgentParams,
    models: ModelFactory,
    text: str,
    config: RunnableConfig,
) -> RecipeOutput:
    """The team as one function: design, file list, names read in Python, a batch of
    drafts, then per round a batch of reviews and one of revisions."""
    parser = StrOutputParser()
    design_chain = multi_agent.architect_prompt | models.chat(params.design_tokens) | parser
    list_chain = multi_agent.list_prompt | models.chat(params.list_tokens) | parser
    coder, reviewer = models.chat(params.code_tokens), models.chat(params.review_tokens)
    write = multi_agent.write_prompt | coder | parser
    review = multi_agent.review_prompt | reviewer | parser
    revise = multi_agent.revise_prompt | coder | parser
    width = {"max_concurrency": params.width}
    files, rounds = params.files, params.rounds

    def team(requirements: str) -> tuple[str, list[str]]:
        design = design_chain.invoke({"requirements": requirements})
        file_list = list_chain.invoke({"requirements": requirements, "design": design})
        names = multi_agent.file_names(file_list, files)
        code = write.batch([{"design": design, "filename": n} for n in names], width)
        for _ in range(rounds):
            asks = [
                {"design": design, "filename": n, "code": c}
                for n, c in zip(names, code, strict=True)
            ]
            reviews = review.batch(asks, width)
            asks = [{**a, "review": r} for a, r in zip(asks, reviews, strict=True)]
            code = revise.batch(asks, width)
        output = "\n\n".join(f"## {name}\n{c}" for name, c in zip(names, code, strict=True))
        return output, names

    app = models.prepare_function(team, "multi-agent-fn")
    with set_config_context({**config, "max_concurrency": params.width}) as context:
        output, names = context.run(app, multi_agent.requirements_of(params, text))
    depth = 2 + 1 + 2 * params.rounds
    calls = multi_agent.plan(params, text)
    details = {"files": ", ".join(names), **frame_details(app, calls)}
    return RecipeOutput(output, depth, calls, details)


class PlanState(TypedDict, total=False):
    goal: str
    plan: str
    results: Annotated[list[str], operator.add]
    answer: str


class StepState(TypedDict):
    goal: str
    step: str


def plan_execute_app(params: plan_execute.PlanExecuteParams, models: ModelFactory) -> Any:
    """plan-and-execute with Python function nodes (the LCEL form's prompts and calls)."""
    parser = StrOutputParser()
    planner = plan_execute.plan_prompt | models.chat(params.plan_tokens) | parser
    executor = plan_execute.step_prompt | models.chat(params.step_tokens) | parser
    synthesizer = plan_execute.answer_prompt | models.chat(params.answer_tokens) | parser
    steps = params.steps

    def plan(state: PlanState) -> dict[str, str]:
        return {"plan": planner.invoke({"goal": state["goal"]})}

    def fan_out(state: PlanState) -> list[Send]:
        planned = plan_execute.plan_steps(state["plan"], steps)
        return [Send("execute", {"goal": state["goal"], "step": step}) for step in planned]

    def execute(state: StepState) -> dict[str, list[str]]:
        return {"results": [executor.invoke({"goal": state["goal"], "step": state["step"]})]}

    def synthesize(state: PlanState) -> dict[str, str]:
        answer = synthesizer.invoke({"goal": state["goal"], "results": state["results"]})
        return {"answer": answer}

    builder = StateGraph(PlanState)
    builder.add_node("plan", plan)
    builder.add_node("execute", execute)
    builder.add_node("synthesize", synthesize)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", fan_out, ["execute"])
    builder.add_edge("execute", "synthesize")
    builder.add_edge("synthesize", END)
    return builder.compile()


def plan_execute_run(
    params: plan_execute.PlanExecuteParams,
    models: ModelFactory,
    text: str,
    config: RunnableConfig,
) -> RecipeOutput:
    app = prepare_graph(models, plan_execute_app(params, models), "plan-execute-fn")
    return plan_execute.run_plan_graph(app, params.goal_tokens, params.steps + 2, text, config)


def _run_async(app: Any, *args: Any) -> Any:
    import asyncio

    return asyncio.run(app(*args))
