"""Differential tests: each graph synthesizer against the stock one, same model and chunks.

Greedy decoding on one real server, so equal prompts give equal answers: the graph
synthesizers must give exactly the stock final text, in every mode (sync, async,
streaming), on the speculative path and after cuts, while sending fewer frames.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import pytest
from llama_index.core.indices.prompt_helper import PromptHelper
from llama_index.core.llms.mock import MockLLM
from llama_index.core.response_synthesizers import (
    BaseSynthesizer,
    CompactAndRefine,
    Refine,
    TreeSummarize,
)
from llamaindex_support import client_frames, metric

from eclectus.adapters.llamaindex import (
    Eclectus,
    EclectusCompactAndRefine,
    EclectusRefine,
    EclectusTreeSummarize,
    get_response_synthesizer,
)
from eclectus.server.front.app import EclectusServer

WORDS = "river stone cloud ember lantern orchard meadow signal harbor quartz willow canyon"
CHUNKS = [
    " ".join(WORDS.split()[(i + j) % 12] for j in range(70)) + f" (part {i})." for i in range(6)
]
QUERY = "What do these notes describe?"

CALLS = "eclectus_calls_submitted_total"  # engine requests the server ran
PAIRS = [
    (TreeSummarize, EclectusTreeSummarize),
    (Refine, EclectusRefine),
    (CompactAndRefine, EclectusCompactAndRefine),
]


def _context_for(stock_cls: type[BaseSynthesizer]) -> int:
    # Refine reserves 500 tokens of padding for the answer, so it needs a larger window
    # than a tree to split six paragraphs into several chunks.
    return 400 if stock_cls is TreeSummarize else 900


@pytest.fixture
def make_llm(server: EclectusServer) -> Any:
    made: list[Eclectus] = []

    def factory(**fields: Any) -> Eclectus:
        llm = Eclectus(url=server.url, **{"max_tokens": 12, **fields})
        made.append(llm)
        return llm

    yield factory
    for llm in made:
        llm.close()


async def _answer(
    synth: BaseSynthesizer, chunks: Sequence[str], use_async: bool, **kwargs: Any
) -> str:
    """The synthesizer's final text, draining the token stream when it streams."""
    if use_async:
        result = await synth.aget_response(QUERY, chunks, **kwargs)
        if inspect.isasyncgen(result):
            return "".join([token async for token in result])
        return str(result)
    result = synth.get_response(QUERY, chunks, **kwargs)
    return result if isinstance(result, str) else "".join(result)


async def _compare(
    server: EclectusServer,
    stock: BaseSynthesizer,
    ours: BaseSynthesizer,
    use_async: bool,
    chunks: Sequence[str] = CHUNKS,
) -> tuple[str, float, float]:
    """Both answers (asserted equal) and the frames each sent."""
    before = client_frames(server)
    expected = await _answer(stock, chunks, use_async)
    middle = client_frames(server)
    got = await _answer(ours, chunks, use_async)
    after = client_frames(server)
    assert got == expected
    return got, middle - before, after - middle


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("streaming", [False, True], ids=["text", "streaming"])
@pytest.mark.parametrize("stock_cls, ours_cls", PAIRS, ids=[p[1].__name__ for p in PAIRS])
async def test_graph_synthesizer_matches_stock(
    server: EclectusServer,
    make_llm: Any,
    stock_cls: type[BaseSynthesizer],
    ours_cls: type[BaseSynthesizer],
    streaming: bool,
    use_async: bool,
) -> None:
    """Same final text as the stock synthesizer; without streaming, fewer frames."""
    llm = make_llm(context_window=_context_for(stock_cls))
    stock = stock_cls(llm=llm, streaming=streaming)
    ours = ours_cls(llm=llm, streaming=streaming)
    assert isinstance(ours, stock_cls), "a drop-in: usable wherever the stock one is"
    text, stock_frames, our_frames = await _compare(server, stock, ours, use_async)
    assert text
    assert stock_frames >= 2, "the stock synthesizer made several dependent calls"
    if not streaming:
        assert our_frames < stock_frames


async def test_tree_whose_summaries_fit_is_one_round_trip(
    server: EclectusServer, make_llm: Any
) -> None:
    """Leaves and root go to the server in one frame when the summaries fit one call, and
    the engine runs exactly the stock synthesizer's calls (the speculation held)."""
    llm = make_llm(context_window=400)
    calls_before = metric(server, CALLS)
    expected = await _answer(TreeSummarize(llm=llm), CHUNKS, use_async=True)
    stock_calls = metric(server, CALLS) - calls_before
    frames_before = client_frames(server)
    got = await _answer(EclectusTreeSummarize(llm=llm), CHUNKS, use_async=True)
    assert got == expected
    assert client_frames(server) - frames_before == 1
    assert metric(server, CALLS) - calls_before - stock_calls == stock_calls >= 3


async def test_tree_level_that_cannot_fit_is_cut(server: EclectusServer, make_llm: Any) -> None:
    """Long summaries (large num_output) cannot all fit one call above: that level is
    fetched first (a cut) and the tree continues from the real summaries."""
    llm = make_llm(context_window=400, max_tokens=120)
    ours = EclectusTreeSummarize(llm=llm)
    template = ours._summary_template.partial_format(query_str=QUERY)
    num_leaves = len(ours._repack(template, CHUNKS[:3]))
    assert num_leaves > 1 and not ours._fits_one_call(template, num_leaves), "cuts"
    _, _, our_frames = await _compare(server, TreeSummarize(llm=llm), ours, True, CHUNKS[:3])
    assert our_frames >= 2


async def test_tree_speculation_that_fails_falls_back_exactly(
    server: EclectusServer, make_llm: Any
) -> None:
    """A prompt helper that counts four tokens per byte makes the real summaries overflow
    the one call the plan speculated on; the check catches it and the answer is still the
    stock one."""

    def heavy_tokenizer(text: str) -> list[int]:
        return list(text.encode()) * 4

    llm = make_llm(context_window=1400)
    helper = PromptHelper.from_llm_metadata(llm.metadata, tokenizer=heavy_tokenizer)
    ours = EclectusTreeSummarize(llm=llm, prompt_helper=helper)
    chunks = CHUNKS[:4]
    template = ours._summary_template.partial_format(query_str=QUERY)
    num_leaves = len(ours._repack(template, chunks))
    assert num_leaves > 1 and ours._fits_one_call(template, num_leaves), "speculates"
    _, _, our_frames = await _compare(
        server, TreeSummarize(llm=llm, prompt_helper=helper), ours, True, chunks
    )
    assert our_frames >= 2, "the speculated root was discarded and the tree continued"


async def test_refine_chunks_that_split_mid_chain_are_replayed(
    server: EclectusServer, make_llm: Any
) -> None:
    """With almost no padding for the answer, compacted chunks fill the window, so a chunk
    no longer fits once an answer is in the refine prompt: the stock loop splits it, which
    the plan could not know; the replay catches it and re-plans from there."""
    llm = make_llm(context_window=350)
    stock = CompactAndRefine(llm=llm, response_padding_size=1)
    ours = EclectusCompactAndRefine(llm=llm, response_padding_size=1)
    chunks = list(ours._chunks(QUERY, CHUNKS))
    assert len(chunks) > 2 and len(ours._refit(QUERY, "x " * 12, chunks[1])) > 1, "splits"
    _, _, our_frames = await _compare(server, stock, ours, use_async=False)
    assert our_frames >= 2


async def test_refine_all_empty_answers_give_the_stock_empty_response(
    server: EclectusServer, make_llm: Any
) -> None:
    """A stop string equal to the first character of every answer makes them all empty: the
    stock loop then stays on the QA template for each next chunk, which the plan (assuming
    refine steps) did not foresee; the replay re-plans after every step and agrees."""
    probe = make_llm(context_window=900)
    first = await _answer(Refine(llm=probe), CHUNKS[:1], use_async=True)
    llm = make_llm(context_window=900, stop=[first[0]])
    text, _, our_frames = await _compare(
        server, Refine(llm=llm), EclectusRefine(llm=llm), use_async=True
    )
    assert text == "Empty Response"
    assert our_frames >= 2


async def test_refine_continues_from_a_previous_response(
    server: EclectusServer, make_llm: Any
) -> None:
    llm = make_llm(context_window=900)
    stock = await Refine(llm=llm).aget_response(QUERY, CHUNKS[:3], prev_response="So far: x.")
    ours = await EclectusRefine(llm=llm).aget_response(
        QUERY, CHUNKS[:3], prev_response="So far: x."
    )
    assert ours == stock


async def test_no_chunks_give_the_stock_empty_response(make_llm: Any) -> None:
    llm = make_llm(context_window=900)
    assert await EclectusRefine(llm=llm).aget_response(QUERY, []) == "Empty Response"


@pytest.mark.parametrize("stock_cls, ours_cls", PAIRS, ids=[p[1].__name__ for p in PAIRS])
def test_other_llms_run_the_stock_code(
    stock_cls: type[BaseSynthesizer], ours_cls: type[BaseSynthesizer]
) -> None:
    """With an LLM that is not Eclectus the graph synthesizers are the stock ones."""
    llm = MockLLM(max_tokens=8)
    expected = stock_cls(llm=llm).get_response(QUERY, CHUNKS[:3])
    assert ours_cls(llm=llm).get_response(QUERY, CHUNKS[:3]) == expected


def test_factory_swaps_in_the_graph_synthesizers(make_llm: Any) -> None:
    """get_response_synthesizer returns the graph classes for the multi-call modes only."""
    llm = make_llm(context_window=900)
    assert type(get_response_synthesizer("tree_summarize", llm=llm)) is EclectusTreeSummarize
    assert type(get_response_synthesizer("refine", llm=llm)) is EclectusRefine
    assert type(get_response_synthesizer("compact", llm=llm)) is EclectusCompactAndRefine
    simple = get_response_synthesizer("simple_summarize", llm=llm)
    assert not isinstance(simple, EclectusRefine | EclectusTreeSummarize)
    streaming = get_response_synthesizer("tree_summarize", llm=llm, streaming=True)
    assert streaming._streaming
