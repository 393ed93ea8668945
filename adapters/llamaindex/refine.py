"""``EclectusRefine`` and ``EclectusCompactAndRefine``: the refine chain as one graph.

The stock Refine loop, one round trip per chunk: answer the first chunk with the QA
template; then for each next chunk, repack it against the refine template filled with the
current answer (it may split in two if the answer grew), and ask for a refined answer whose
``existing_answer`` is the current one. An empty refined answer keeps the previous one
(``if resp := ...``) unless streaming.

Here the chain is planned symbolically and submitted at once: step k's ``existing_answer``
is step k-1's output variable, so the server runs the chain back to back. Two decisions of
the stock loop depend on answer text the plan does not have yet: whether the next chunk
still fits once the answer is in the prompt, and whether the answer was empty. The plan
assumes "fits" and "non-empty"; after one get of all step outputs, :meth:`_replay` re-runs
the stock loop on the real values and accepts each planned step whose inputs (template,
chunk, existing answer) match what the stock loop would have sent. At the first mismatch the
rest is planned again from the real state: a cut. So the final text equals the stock one;
the cost of a wrong guess is the discarded tail of the chain. With the default
``response_padding_size`` (500) and a small ``num_output``, the guesses hold.

When streaming, all steps but the last are fetched and checked, then the last streams.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llama_index.core.async_utils import asyncio_run
from llama_index.core.prompts.prompt_utils import get_biggest_prompt
from llama_index.core.response_synthesizers.compact_and_refine import CompactAndRefine
from llama_index.core.response_synthesizers.refine import Refine
from llama_index.core.types import RESPONSE_TEXT_TYPE

from eclectus.adapters.client import SemanticVariable
from eclectus.adapters.llamaindex.graph import (
    Outcome,
    afinish,
    fetch_texts,
    finish,
    graph_ready,
)
from eclectus.adapters.llamaindex.llm import Eclectus

EMPTY_RESPONSE = "Empty Response"  # what the stock loop answers when nothing came back


@dataclass(frozen=True, slots=True)
class Step:
    """One planned call of the chain. ``prev_step`` (index of the step whose output is this
    step's existing answer) or ``prev_text`` (a known existing answer) is set for a refine
    step; neither for the first QA step."""

    chunk: str
    var: SemanticVariable
    prev_step: int | None = None
    prev_text: str | None = None


@dataclass(slots=True)
class ChainState:
    """Where the stock loop stands: the current answer (None before the first) and the
    chunks still to process, front first."""

    response: str | None
    chunks: deque[str]


class EclectusRefine(Refine):
    """A drop-in Refine (same constructor) that submits the chain as a graph. Falls back to
    the stock code for structured answer filtering, custom programs, ``output_cls``,
    output parsers, multimodal chunks or a non-Eclectus LLM."""

    def _graph_ready(self, prev_response: Any) -> bool:
        return (
            graph_ready(self)
            and not self._structured_answer_filtering
            and (prev_response is None or isinstance(prev_response, str))
        )

    def _initial_chunks(self, text_chunks: Sequence[str]) -> deque[str]:
        """The stock loop's first packing: each chunk alone, with room for the answer."""
        max_prompt = get_biggest_prompt([self._text_qa_template, self._refine_template])
        return deque(
            piece
            for chunk in text_chunks
            for piece in self._prompt_helper.repack(
                max_prompt, [chunk], llm=self._llm, padding=self._response_padding_size
            )
        )

    def _refit(self, query_str: str, response: str, chunk: str) -> list[str]:
        """The stock refine step's repack of ``chunk`` against the current answer (pure)."""
        template = self._refine_template.partial_format(
            query_str=query_str, existing_answer=response
        )
        return self._prompt_helper.repack(template, [chunk], llm=self._llm)

    def _plan(self, query_str: str, state: ChainState, kwargs: dict[str, Any]) -> list[Step]:
        """Build the calls for all remaining chunks (mutates: buffers calls in the session;
        ``state`` is left as it was). Exact while the answer is known text; past that it
        assumes each chunk fits and each answer is non-empty."""
        llm = self._llm
        assert isinstance(llm, Eclectus)
        qa = self._text_qa_template.partial_format(query_str=query_str)
        refine = self._refine_template.partial_format(query_str=query_str)
        chunks = deque(state.chunks)
        steps: list[Step] = []
        while chunks:
            chunk = chunks.popleft()
            if not steps and state.response is None:
                steps.append(Step(chunk, llm.template_call(qa, context_str=chunk, **kwargs)))
                continue
            prev_step: int | None = None
            prev_text: str | None = None
            if steps:
                prev_step = len(steps) - 1
                prev: SemanticVariable | str = steps[-1].var
            else:  # the answer is known text: repack exactly as the stock loop does
                assert state.response is not None
                pieces = self._refit(query_str, state.response, chunk)
                if len(pieces) > 1:
                    chunks.extendleft(pieces)  # (reverses them, as the stock loop does)
                    continue
                chunk = pieces[0]
                prev = prev_text = state.response
            var = llm.template_call(refine, existing_answer=prev, context_msg=chunk, **kwargs)
            steps.append(Step(chunk, var, prev_step, prev_text))
        return steps

    def _replay(
        self, query_str: str, state: ChainState, steps: list[Step], values: list[str]
    ) -> tuple[int, ChainState]:
        """Re-run the stock loop from ``state`` on the real ``values`` of the planned steps
        (pure). Returns how many steps were accepted and the state after them; a step is
        accepted when its planned inputs are exactly what the stock loop would send."""
        response, chunks = state.response, deque(state.chunks)
        accepted = 0
        while chunks and accepted < len(steps):
            raw = chunks.popleft()
            chunk, prev_text = raw, response
            if response is not None:
                pieces = self._refit(query_str, response, raw)
                if len(pieces) > 1:
                    chunks.extendleft(pieces)
                    continue
                chunk = pieces[0]
            step = steps[accepted]
            planned_prev = step.prev_text if step.prev_step is None else values[step.prev_step]
            if (step.chunk, planned_prev) != (chunk, prev_text):
                chunks.appendleft(raw)
                break
            if accepted < len(values):
                answer = values[accepted]
                # stock: an empty answer keeps the old one, except when streaming
                response = answer if (answer or self._streaming) else response
            accepted += 1
        return accepted, ChainState(response, chunks)

    async def _aplan(
        self,
        query_str: str,
        chunks: deque[str],
        prev_response: str | None,
        kwargs: dict[str, Any],
    ) -> Outcome:
        """Plan, fetch, replay, and re-plan after a cut until every chunk is answered.
        Returns the final text, or the last step's unfetched variable when streaming."""
        llm = self._llm
        assert isinstance(llm, Eclectus)
        state = ChainState(prev_response, chunks)
        while state.chunks:
            steps = self._plan(query_str, state, kwargs)
            wanted = steps[:-1] if self._streaming else steps
            values = await fetch_texts(llm, [step.var for step in wanted])
            accepted, after = self._replay(query_str, state, steps, values)
            assert accepted > 0, "the first planned step always matches the real state"
            if self._streaming and accepted == len(steps):
                if not after.chunks:
                    return steps[-1].var
                # a later chunk split after all: the streamed step's answer is needed now
                (after.response,) = await fetch_texts(llm, [steps[-1].var])
            state = after
        return state.response or EMPTY_RESPONSE

    def _chunks(self, query_str: str, text_chunks: Sequence[str]) -> deque[str]:
        return self._initial_chunks(text_chunks)

    async def aget_response(
        self,
        query_str: str,
        text_chunks: Sequence[str],
        prev_response: RESPONSE_TEXT_TYPE | None = None,
        **response_kwargs: Any,
    ) -> RESPONSE_TEXT_TYPE:
        """The stock answer, computed as a chain graph (see the module docstring)."""
        if not self._graph_ready(prev_response):
            return await Refine.aget_response(
                self,
                query_str,
                self._stock_chunks(query_str, text_chunks),
                prev_response,
                **response_kwargs,
            )
        chunks = self._chunks(query_str, text_chunks)
        outcome = await self._aplan(query_str, chunks, prev_response, response_kwargs)
        return await afinish(self._llm, outcome, self._streaming)  # type: ignore[arg-type]

    def get_response(
        self,
        query_str: str,
        text_chunks: Sequence[str],
        prev_response: RESPONSE_TEXT_TYPE | None = None,
        **response_kwargs: Any,
    ) -> RESPONSE_TEXT_TYPE:
        """The sync twin of :meth:`aget_response`; a sync token generator when streaming."""
        if not self._graph_ready(prev_response):
            return Refine.get_response(
                self,
                query_str,
                self._stock_chunks(query_str, text_chunks),
                prev_response,
                **response_kwargs,
            )
        chunks = self._chunks(query_str, text_chunks)
        outcome = asyncio_run(self._aplan(query_str, chunks, prev_response, response_kwargs))
        return finish(self._llm, outcome, self._streaming)  # type: ignore[arg-type]

    def _stock_chunks(self, query_str: str, text_chunks: Sequence[str]) -> Sequence[str]:
        """The chunks the stock Refine loop is given (CompactAndRefine compacts first)."""
        return text_chunks


class EclectusCompactAndRefine(EclectusRefine, CompactAndRefine):
    """A drop-in CompactAndRefine: chunks are first packed together as densely as the
    prompt allows (LlamaIndex's own packing), then refined as one chain graph."""

    def _stock_chunks(self, query_str: str, text_chunks: Sequence[str]) -> Sequence[str]:
        return self._make_compact_text_chunks(query_str, text_chunks)

    def _chunks(self, query_str: str, text_chunks: Sequence[str]) -> deque[str]:
        return self._initial_chunks(self._stock_chunks(query_str, text_chunks))
