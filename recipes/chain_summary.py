"""``chain-summary``: a refine chain over the chunks, each step consuming the previous summary.

LangChain's "refine" pattern written in LCEL: the first chunk is summarized, then each step
``RunnablePassthrough.assign``s a new ``summary`` from the previous one and the next chunk.
Every call depends on the one before (depth = number of chunks), which is where a completion
API pays one client round trip per step and ``compile`` sends the whole chain as one graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnablePassthrough,
    RunnablePick,
)

from eclectus.recipes.result import RecipeOutput
from eclectus.recipes.target import ModelFactory
from eclectus.recipes.text import check_num_chunks, split_chunks

INITIAL_PROMPT = (
    "Write a concise summary of the following text, keeping its key facts.\n\n"
    "Text:\n{text}\n\nSummary:"
)
REFINE_PROMPT = (
    "Your job is to produce a final summary. Here is the summary so far:\n{summary}\n\n"
    "Refine it with the following new text, adding what matters and keeping it concise.\n\n"
    "Text:\n{text}\n\nRefined summary:"
)


@dataclass(frozen=True, slots=True)
class ChainSummaryParams:
    """Sizes of a refine-chain run (tokens are the model's; see text.approx_tokens)."""

    chunk_tokens: int = 1024
    num_chunks: int | None = 16  # None: the whole document
    summary_tokens: int = 50  # output of every step

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1 or self.summary_tokens < 1:
            raise ValueError("chunk_tokens and summary_tokens must be >= 1")
        check_num_chunks(self.num_chunks)


def build_chain(params: ChainSummaryParams, models: ModelFactory, num_chunks: int) -> Runnable:
    """Input ``{chunk_0: ..., ...}``; output the final summary (pure)."""
    llm, parser = models.llm(params.summary_tokens), StrOutputParser()
    initial = PromptTemplate.from_template(INITIAL_PROMPT) | llm | parser
    refine = PromptTemplate.from_template(REFINE_PROMPT) | llm | parser
    chain: Runnable = RunnablePassthrough.assign(
        summary={"text": RunnablePick("chunk_0")} | initial
    )
    for i in range(1, num_chunks):
        step = {"summary": RunnablePick("summary"), "text": RunnablePick(f"chunk_{i}")} | refine
        chain = chain | RunnablePassthrough.assign(summary=step)
    return chain | RunnablePick("summary")


def plan(params: ChainSummaryParams, text: str) -> int:
    """Planned model calls (one per chunk) (pure)."""
    return len(split_chunks(text, params.chunk_tokens, params.num_chunks))


def run(
    params: ChainSummaryParams, models: ModelFactory, text: str, config: RunnableConfig
) -> RecipeOutput:
    """Summarize ``text`` step by step; ``config`` carries the callbacks."""
    chunks = split_chunks(text, params.chunk_tokens, params.num_chunks)
    chain = models.prepare(build_chain(params, models, len(chunks)), "chain-summary")
    summary = chain.invoke({f"chunk_{i}": c for i, c in enumerate(chunks)}, config)
    return RecipeOutput(summary, len(chunks), len(chunks), {"chunks": len(chunks)})
