"""``map-reduce``: summarize a long document by chunks (map, in parallel), combine (reduce).

An ordinary LCEL app: ``PromptTemplate | llm | StrOutputParser`` per step, a
``RunnableParallel`` for the fan-out (run with ``max_concurrency`` = width). When the map
summaries would not fit one combine prompt, they are first collapsed in groups, level after
level (LangChain's "collapse" step). The levels are planned from the output bound — a
summary is at most ``map_tokens`` tokens — rather than measured after the fact, so the whole
job is one static chain that ``compile`` can send to Eclectus as one graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig, RunnableParallel, RunnablePick

from eclectus.recipes.result import RecipeOutput
from eclectus.recipes.target import ModelFactory
from eclectus.recipes.text import approx_tokens, check_num_chunks, split_chunks

MAP_PROMPT = (
    "You are a careful analyst. Write a concise summary of the passage below, keeping its "
    "key facts, names and numbers.\n\nPassage:\n{text}\n\nSummary:"
)
COLLAPSE_HEAD = "Merge these partial summaries of one document into a single summary.\n\n"
REDUCE_HEAD = (
    "Combine these summaries of consecutive parts of one document into a final "
    "summary of the whole document.\n\n"
)
LIST_TAIL = "\n\nSummary:"


@dataclass(frozen=True, slots=True)
class MapReduceParams:
    """Sizes of a map-reduce run (tokens are the model's; see text.approx_tokens)."""

    chunk_tokens: int = 1024  # per map input
    num_chunks: int | None = 16  # None: the whole document
    map_tokens: int = 50  # output per map (and per collapse)
    reduce_tokens: int = 100  # the final summary
    context_tokens: int = 4096  # the most one combine prompt may hold
    width: int = 16  # calls in flight at once (max_concurrency)

    def __post_init__(self) -> None:
        for name in ("chunk_tokens", "map_tokens", "reduce_tokens", "context_tokens", "width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        check_num_chunks(self.num_chunks)


def group_size(params: MapReduceParams) -> int:
    """How many summaries one combine prompt holds: the context less the template, over the
    most a summary can take (its bound plus the list separator). At least 2. Pure."""
    room = params.context_tokens - approx_tokens(REDUCE_HEAD + LIST_TAIL)
    return max(2, room // (params.map_tokens + approx_tokens("\n\n")))


def collapse_levels(num_summaries: int, per_group: int) -> list[int]:
    """Summary counts after each collapse level until one prompt holds them all (pure)."""
    levels: list[int] = []
    while num_summaries > per_group:
        num_summaries = math.ceil(num_summaries / per_group)
        levels.append(num_summaries)
    return levels


def list_prompt(head: str, keys: list[str]) -> PromptTemplate:
    """A prompt listing the inputs ``keys`` one per paragraph (pure)."""
    body = "\n\n".join(f"{{{key}}}" for key in keys)
    return PromptTemplate.from_template(head + body + LIST_TAIL)


def build_chain(
    params: MapReduceParams, models: ModelFactory, num_chunks: int, prefix: str = ""
) -> Runnable:
    """The whole job as one LCEL chain: input ``{chunk_0: ..., ...}``, output the summary.
    ``prefix`` names its keys apart when it is embedded in a larger app. Pure."""
    parser = StrOutputParser()
    mapper = PromptTemplate.from_template(MAP_PROMPT) | models.llm(params.map_tokens) | parser
    stage = RunnableParallel(
        {
            f"{prefix}s0_{i}": {"text": RunnablePick(f"{prefix}chunk_{i}")} | mapper
            for i in range(num_chunks)
        }
    )
    chain: Runnable = stage
    keys = list(stage.steps__)
    per_group = group_size(params)
    for level, count in enumerate(collapse_levels(num_chunks, per_group), start=1):
        groups = [keys[j * per_group : (j + 1) * per_group] for j in range(count)]
        collapser = models.llm(params.map_tokens)
        stage = RunnableParallel(
            {
                f"{prefix}s{level}_{j}": list_prompt(COLLAPSE_HEAD, group) | collapser | parser
                for j, group in enumerate(groups)
            }
        )
        chain = chain | stage
        keys = list(stage.steps__)
    return chain | list_prompt(REDUCE_HEAD, keys) | models.llm(params.reduce_tokens) | parser


def planned_calls(params: MapReduceParams, num_chunks: int) -> tuple[int, int]:
    """(model calls, dependency depth) of a run over ``num_chunks`` chunks (pure)."""
    levels = collapse_levels(num_chunks, group_size(params))
    return num_chunks + sum(levels) + 1, len(levels) + 2


def planned_output_tokens(params: MapReduceParams, num_chunks: int) -> int:
    """Tokens a run over ``num_chunks`` chunks generates when every call generates its whole
    budget (as the evals' calls do: ``ignore_eos``) (pure)."""
    calls, _ = planned_calls(params, num_chunks)
    return (calls - 1) * params.map_tokens + params.reduce_tokens


def run(
    params: MapReduceParams, models: ModelFactory, text: str, config: RunnableConfig
) -> RecipeOutput:
    """Summarize ``text``; ``config`` carries the callbacks (and gets max_concurrency)."""
    chunks = split_chunks(text, params.chunk_tokens, params.num_chunks)
    chain = models.prepare(build_chain(params, models, len(chunks)), "map-reduce")
    inputs = {f"chunk_{i}": chunk for i, chunk in enumerate(chunks)}
    summary = chain.invoke(inputs, {**config, "max_concurrency": params.width})
    calls, depth = planned_calls(params, len(chunks))
    return RecipeOutput(summary, depth, calls, {"chunks": len(chunks)})


def plan(params: MapReduceParams, text: str) -> int:
    """Planned model calls over ``text`` (for progress) (pure)."""
    chunks = split_chunks(text, params.chunk_tokens, params.num_chunks)
    return planned_calls(params, len(chunks))[0]
