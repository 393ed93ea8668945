"""``EclectusTreeSummarize``: LlamaIndex's TreeSummarize, submitted as one graph.

The stock algorithm, one level per round trip: repack the chunks to fill the context window;
if one chunk is left, answer from it; otherwise summarize every chunk, and start again with
the summaries as the chunks.

Here a leaf level and the level above it go to the server together: the leaf summaries are
SemanticVariables, the server's ``join`` op concatenates them exactly as the stock repack
does (``"\\n\\n".join``) and the root call consumes the joined variable, so the server runs
leaves and root without a client round trip between them.

Why this is exact, and where it cannot be: the stock code repacks each level using the
*actual* lengths of the summaries below it, which the graph cannot know before they are
generated. So the graph speculates that the summaries fit in one call above (planned only
when ``num_chunks * max_tokens`` leaves room, which is common with a small ``num_output``),
fetches the leaf summaries together with the root, and checks the speculation with
LlamaIndex's own PromptHelper: if the stock repack of the real summaries is the joined text,
the root's prompt is byte-identical to the stock one and its answer is final. If not (the
summaries are longer, or a summary has surrounding whitespace the stock code would strip),
the root is discarded and the algorithm continues from the real summaries: a cut. Levels
whose summaries cannot fit in one call are cut from the start (get that level, then
continue). Either way the final text equals the stock synthesizer's with the same model,
chunks and greedy decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.async_utils import asyncio_run
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.response_synthesizers.tree_summarize import TreeSummarize
from llama_index.core.types import RESPONSE_TEXT_TYPE

from eclectus.adapters.llamaindex.graph import (
    Outcome,
    afinish,
    fetch_texts,
    finish,
    graph_ready,
)
from eclectus.adapters.llamaindex.llm import Eclectus

# What the stock repack puts between two chunks it concatenates (PromptHelper.repack).
REPACK_SEP = "\n\n"


class EclectusTreeSummarize(TreeSummarize):
    """A drop-in TreeSummarize (same constructor) that submits the tree as a graph.

    With a non-Eclectus LLM, ``output_cls``, an output parser or multimodal chunks it runs
    the stock code unchanged. Planning never mutates the synthesizer."""

    def _repack(self, template: BasePromptTemplate, chunks: Sequence[str]) -> list[str]:
        return self._prompt_helper.repack(template, text_chunks=chunks, llm=self._llm)

    def _fits_one_call(self, template: BasePromptTemplate, num_summaries: int) -> bool:
        """Whether ``num_summaries`` summaries of at most ``num_output`` tokens each are
        likely to fit in one call (never when the summaries are unbounded: ``max_tokens``
        None). Only a guess (the prompt helper counts with its own tokenizer); the real
        summaries are checked before the root's answer is used."""
        llm = self._llm
        assert isinstance(llm, Eclectus)
        num_output = llm.metadata.num_output
        if num_output <= 0:
            return False
        splitter = self._prompt_helper.get_text_splitter_given_prompt(template, llm=llm)
        # one token per separator: "\n\n" is a single token in common BPE vocabularies
        return num_summaries * (num_output + 1) <= splitter.chunk_size

    async def _aplan(
        self, query_str: str, text_chunks: Sequence[str], response_kwargs: dict[str, Any]
    ) -> Outcome:
        """Run the tree as graphs; returns the answer's text, or (when streaming, or when
        one chunk was left) the unfetched root variable. Mutates only the server session."""
        llm = self._llm
        assert isinstance(llm, Eclectus)
        template = self._summary_template.partial_format(query_str=query_str)
        chunks = self._repack(template, text_chunks)
        while len(chunks) > 1:
            leaves = [
                llm.template_call(template, context_str=chunk, **response_kwargs)
                for chunk in chunks
            ]
            if not self._fits_one_call(template, len(leaves)):
                chunks = self._repack(template, await fetch_texts(llm, leaves))  # a cut
                continue
            joined = llm.join(leaves, sep=REPACK_SEP)
            root = llm.template_call(template, context_str=joined, **response_kwargs)
            # Streaming fetches the leaves only: the root streams once they are checked.
            wanted = leaves if self._streaming else [*leaves, root]
            values = await fetch_texts(llm, wanted)
            summaries = values[: len(leaves)]
            chunks = self._repack(template, summaries)
            if chunks == [REPACK_SEP.join(summaries)]:
                return root if self._streaming else values[-1]
            # The stock code would pack these summaries differently: continue from them.
        return llm.template_call(template, context_str=chunks[0], **response_kwargs)

    async def aget_response(
        self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any
    ) -> RESPONSE_TEXT_TYPE:
        """The stock answer, computed as graphs (see the module docstring)."""
        if not graph_ready(self):
            return await super().aget_response(query_str, text_chunks, **response_kwargs)
        outcome = await self._aplan(query_str, text_chunks, response_kwargs)
        return await afinish(self._llm, outcome, self._streaming)  # type: ignore[arg-type]

    def get_response(
        self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any
    ) -> RESPONSE_TEXT_TYPE:
        """The sync twin of :meth:`aget_response`; a sync token generator when streaming."""
        if not graph_ready(self):
            return super().get_response(query_str, text_chunks, **response_kwargs)
        outcome = asyncio_run(self._aplan(query_str, text_chunks, response_kwargs))
        return finish(self._llm, outcome, self._streaming)  # type: ignore[arg-type]
