"""The refine replay: which planned steps the stock loop would have made (pure logic on
values given here; the LLM only supplies metadata and variables)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import pytest

from eclectus.adapters.llamaindex import Eclectus, EclectusRefine
from eclectus.adapters.llamaindex.refine import ChainState, Step
from eclectus.server.front.app import EclectusServer

QUERY = "q?"
CHUNKS = ["first chunk.", "second chunk.", "third chunk."]


@pytest.fixture
def refine_llm(server: EclectusServer) -> Iterator[Eclectus]:
    llm = Eclectus(url=server.url, max_tokens=12, context_window=900)
    yield llm
    llm.close()


def _chain(llm: Eclectus) -> list[Step]:
    """The plan's shape for three chunks from no answer: QA, then two refines in a row."""
    var = [llm.client.variable(f"unused {i}") for i in range(3)]
    return [Step(CHUNKS[0], var[0]), *(Step(CHUNKS[i], var[i], prev_step=i - 1) for i in (1, 2))]


def test_all_steps_accepted_when_answers_are_non_empty(refine_llm: Eclectus) -> None:
    synth = EclectusRefine(llm=refine_llm)
    state = ChainState(None, deque(CHUNKS))
    accepted, after = synth._replay(QUERY, state, _chain(refine_llm), ["a", "b", "c"])
    assert accepted == 3
    assert after.response == "c" and not after.chunks
    assert list(state.chunks) == CHUNKS, "the replay does not mutate its input"


def test_empty_answer_keeps_the_previous_one_and_stops_the_replay(refine_llm: Eclectus) -> None:
    """Step 2 answered "", so the stock loop refines chunk 3 against "a", not "": the
    planned step 3 is rejected and the chain resumes from chunk 3 with answer "a"."""
    synth = EclectusRefine(llm=refine_llm)
    state = ChainState(None, deque(CHUNKS))
    accepted, after = synth._replay(QUERY, state, _chain(refine_llm), ["a", "", "c"])
    assert accepted == 2
    assert after.response == "a"
    assert list(after.chunks) == CHUNKS[2:]


def test_streaming_accepts_empty_answers_like_the_stock_loop(refine_llm: Eclectus) -> None:
    """When streaming the stock loop takes every answer, even an empty one."""
    synth = EclectusRefine(llm=refine_llm, streaming=True)
    state = ChainState(None, deque(CHUNKS))
    accepted, after = synth._replay(QUERY, state, _chain(refine_llm), ["a", ""])
    assert accepted == 3, "the last step (not fetched when streaming) is accepted on inputs"
    assert not after.chunks


def test_empty_first_answer_means_the_next_step_is_qa_again(refine_llm: Eclectus) -> None:
    synth = EclectusRefine(llm=refine_llm)
    state = ChainState(None, deque(CHUNKS))
    accepted, after = synth._replay(QUERY, state, _chain(refine_llm), ["", "b", "c"])
    assert accepted == 1
    assert after.response is None
    assert list(after.chunks) == CHUNKS[1:]
