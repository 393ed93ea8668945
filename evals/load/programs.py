"""One program instance of the load eval, run as the recipes run it.

Every instance builds its own model objects from its own :class:`ModelFactory` (Eclectus
mode: its own application name, so its own session; openai mode: stock ``langchain_openai``
classes), reads its own fresh document (the sample with its letters permuted by the
instance's seed: nothing but what real apps share can come from a prefix cache), runs in its
own asyncio task, and closes its session when it ends. The chats share one handbook per run,
the system prompt of a GPTs-style app.

``variant`` "swap" is the import swap alone (the drop-in model classes, every call a round
trip); "compiled" wraps the chains (``compile``) and the LangGraph app (the LangGraph
compiler) where the recipe does. A chat is one call either way and streams its answer, so its
time to first token is measured.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.output_parsers import StrOutputParser

from eclectus.evals.fresh import fresh_text
from eclectus.evals.load.mix import ProgramSpec, Sizes
from eclectus.evals.systems import Variant
from eclectus.recipes import chain_summary, map_reduce, multi_agent, shared_prompt, tool_agent
from eclectus.recipes.graphs import prepare_graph
from eclectus.recipes.target import ModelFactory, Target
from eclectus.recipes.text import load_sample, split_chunks

SAMPLES = {  # the bundled document each type reads (its recipe's)
    "chat": "field-guide",
    "map-reduce": "field-guide",
    "chain-summary": "history-essay",
    "multi-agent": "design-note",
    "tool-agent": "field-guide",
}


@dataclass(frozen=True, slots=True)
class RunContext:
    """What every program of one run shares. ``tag`` names the run's sessions apart;
    ``priority``: send each program's arrival order as vLLM's request priority (stock apps
    straight to a vLLM with ``--scheduling-policy priority``)."""

    target: Target
    variant: Variant
    sizes: Sizes
    handbook: str  # the chats' shared system prompt text
    tag: str
    priority: bool = False

    def models(self, spec: ProgramSpec) -> ModelFactory:
        """The program's own model factory (pure)."""
        target = dataclasses.replace(self.target, use_compile=self.variant == "compiled")
        return ModelFactory(
            target,
            app=f"{self.tag}-{spec.index}",
            priority=spec.index if self.priority else None,
        )


def run_handbook(seed: int, sizes: Sizes) -> str:
    """The run's shared handbook: the head of the chats' sample, permuted by ``seed`` (pure)."""
    return split_chunks(fresh_text(load_sample(SAMPLES["chat"]), seed), sizes.system_tokens, 1)[0]


async def run_program(
    spec: ProgramSpec, ctx: RunContext, on_first_token: Callable[[], None]
) -> str:
    """Run one program to its end (network: its calls); its final text. ``on_first_token``
    is called when a chat's first piece of answer arrives. Its session stays open: the
    caller closes it (:func:`close_session`), after the answer, as a finished app would."""
    text = fresh_text(load_sample(SAMPLES[spec.kind]), spec.seed)
    return await _RUNNERS[spec.kind](spec, ctx, ctx.models(spec), text, on_first_token)


async def _chat(
    spec: ProgramSpec, ctx: RunContext, models: ModelFactory, text: str, first: Callable[[], None]
) -> str:
    sizes = ctx.sizes
    chain = shared_prompt.chat_prompt | models.chat(sizes.answer_tokens) | StrOutputParser()
    chain = models.prepare(chain, "chat")
    pieces: list[str] = []
    question = _question(text, spec.seed)
    async for piece in chain.astream({"handbook": ctx.handbook, "question": question}):
        if not pieces:
            first()
        pieces.append(piece)
    return "".join(pieces)


async def _map_reduce(
    spec: ProgramSpec, ctx: RunContext, models: ModelFactory, text: str, first: Callable[[], None]
) -> str:
    sizes = ctx.sizes
    params = map_reduce.MapReduceParams(
        chunk_tokens=sizes.chunk_tokens,
        num_chunks=spec.shape,
        map_tokens=sizes.map_tokens,
        reduce_tokens=sizes.reduce_tokens,
        width=spec.shape,
    )
    chunks = split_chunks(text, params.chunk_tokens, spec.shape)
    chain = models.prepare(map_reduce.build_chain(params, models, len(chunks)), "map-reduce")
    inputs = {f"chunk_{i}": chunk for i, chunk in enumerate(chunks)}
    return str(await chain.ainvoke(inputs, {"max_concurrency": params.width}))


async def _chain_summary(
    spec: ProgramSpec, ctx: RunContext, models: ModelFactory, text: str, first: Callable[[], None]
) -> str:
    sizes = ctx.sizes
    params = chain_summary.ChainSummaryParams(
        chunk_tokens=sizes.chunk_tokens, num_chunks=spec.shape, summary_tokens=sizes.map_tokens
    )
    chunks = split_chunks(text, params.chunk_tokens, spec.shape)
    chain = models.prepare(chain_summary.build_chain(params, models, len(chunks)), "chain")
    return str(await chain.ainvoke({f"chunk_{i}": c for i, c in enumerate(chunks)}))


async def _multi_agent(
    spec: ProgramSpec, ctx: RunContext, models: ModelFactory, text: str, first: Callable[[], None]
) -> str:
    sizes = ctx.sizes
    params = multi_agent.MultiAgentParams(
        files=spec.shape,
        rounds=1,
        requirements_tokens=sizes.requirements_tokens,
        design_tokens=sizes.design_tokens,
        list_tokens=sizes.list_tokens,
        code_tokens=sizes.code_tokens,
        review_tokens=sizes.review_tokens,
        width=spec.shape,
    )
    config: dict[str, Any] = {"max_concurrency": params.width}
    architect = models.prepare(multi_agent.build_architect(params, models), "architect")
    requirements = multi_agent.requirements_of(params, text)
    planned = await architect.ainvoke({"requirements": requirements}, config)
    names = multi_agent.file_names(planned["file_list"], params.files)
    team = models.prepare(multi_agent.build_team(params, models, names), "team")
    inputs = {"design": planned["design"], **{f"name_{i}": n for i, n in enumerate(names)}}
    files = await team.ainvoke(inputs, config)
    return "\n".join(files[f"file_{i}"] for i in range(len(names)))


async def _tool_agent(
    spec: ProgramSpec, ctx: RunContext, models: ModelFactory, text: str, first: Callable[[], None]
) -> str:
    sizes = ctx.sizes
    params = tool_agent.ToolAgentParams(
        tool_rounds=2,  # two tool turns and the answer: 3 model turns
        question_tokens=sizes.question_tokens,
        tool_tokens=sizes.tool_tokens,
        answer_tokens=sizes.tool_answer_tokens,
        # a forced call tiny runs to its budget unclosed counts as its turn: every instance
        # makes 3 model calls, as the per-type SLO assumes (with retries, 7-23 on tiny)
        retry_failed_calls=False,
    )
    app = prepare_graph(models, tool_agent.build_app(params, models, text), "tool-agent")
    head = split_chunks(text, params.question_tokens, 1)[0]
    question = f"What are the key facts of the document that begins: {head!r}?"
    state = await app.ainvoke({"messages": [HumanMessage(question)]})
    return str(state["messages"][-1].content)


def _question(text: str, seed: int) -> str:
    """A chat user's question about one sentence of the program's own document (pure)."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if len(s) > 40]
    rng = random.Random(seed)
    return f'What does the handbook say about this: "{rng.choice(sentences)[:160]}"?'


def close_session(spec: ProgramSpec, ctx: RunContext) -> None:
    """Close the program's session (Eclectus mode; blocking: the close handshake), so the
    server frees it as a finished app would."""
    models = ctx.models(spec)  # the same application name: the program's connection
    if models.backend != "eclectus" or models.app is None:
        return
    from eclectus.adapters.connection import connection_for

    connection_for(models.target.url, models.target.api_key, models.app).close()


_RUNNERS = {
    "chat": _chat,
    "map-reduce": _map_reduce,
    "chain-summary": _chain_summary,
    "multi-agent": _multi_agent,
    "tool-agent": _tool_agent,
}
