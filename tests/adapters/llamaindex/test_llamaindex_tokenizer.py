"""``Eclectus.tokenizer`` (LlamaIndex's ``Settings.tokenizer``): the server's exact ids, one
``tokenize`` round trip per distinct text (the LRU :class:`TokenCache`), and what that saves
a whole LlamaIndex app on a real server."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import llama_index.core
import pytest
from llama_index.core import Settings, SimpleDirectoryReader, SummaryIndex
from llama_index.core.node_parser import SentenceSplitter

from eclectus.adapters.llamaindex import Eclectus, get_response_synthesizer
from eclectus.adapters.llamaindex.token_cache import TokenCache
from eclectus.models.presets import resolve_model_dir
from eclectus.models.tokenizer import Tokenizer
from eclectus.server.front.app import EclectusServer

TEXTS = ["abc", "", " the", "naïve café ☕", "<s>literal", "abc"]


def byte_ids(text: str) -> list[int]:
    """A stand-in tokenizer (one id per byte) for the cache's own tests."""
    return list(text.encode())


@functools.cache
def tiny_tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(resolve_model_dir("tiny"))


def tiny_ids(text: str) -> list[int]:
    """tiny's ids for ``text`` as one non-first segment, computed locally."""
    return tiny_tokenizer().encode(text, add_special_tokens=False)


class Counting:
    """A tokenize function that records what it was asked."""

    def __init__(self, tokenize: Callable[[str], list[int]] = byte_ids) -> None:
        self.tokenize = tokenize
        self.asked: list[str] = []

    def __call__(self, text: str) -> list[int]:
        self.asked.append(text)
        return self.tokenize(text)


# -- the cache on its own -------------------------------------------------------------------


def test_cache_asks_once_per_text_and_hands_out_copies() -> None:
    cache, tokenize = TokenCache(max_tokens=100), Counting()
    first = cache.ids("session", "hello", tokenize)
    first.append(-1)  # the caller's list is its own
    assert cache.ids("session", "hello", tokenize) == byte_ids("hello")
    assert tokenize.asked == ["hello"]


def test_cache_evicts_least_recently_used_within_its_token_budget() -> None:
    """Each entry costs its ids plus one; the oldest-used go first, and a text that alone
    exceeds the budget is answered but not kept."""
    cache, tokenize = TokenCache(max_tokens=10), Counting()
    cache.ids(0, "aaaa", tokenize)  # cost 5
    cache.ids(0, "bbb", tokenize)  # cost 4
    cache.ids(0, "aaaa", tokenize)  # hit: "bbb" is now the least recently used
    cache.ids(0, "c", tokenize)  # cost 2: 11 > 10, "bbb" goes
    assert len(cache) == 2
    cache.ids(0, "aaaa", tokenize)
    cache.ids(0, "bbb", tokenize)
    assert tokenize.asked == ["aaaa", "bbb", "c", "bbb"]
    assert cache.ids(0, "x" * 20, tokenize) == byte_ids("x" * 20)
    assert "x" * 20 not in cache._entries


def test_cache_empties_for_another_session_and_can_be_off() -> None:
    cache, tokenize = TokenCache(max_tokens=100), Counting()
    cache.ids("old", "hi", tokenize)
    cache.ids("new", "hi", tokenize)
    assert tokenize.asked == ["hi", "hi"]
    off, tokenize = TokenCache(max_tokens=0), Counting()
    off.ids(0, "hi", tokenize)
    off.ids(0, "hi", tokenize)
    assert tokenize.asked == ["hi", "hi"] and len(off) == 0
    with pytest.raises(ValueError, match="max_tokens"):
        TokenCache(max_tokens=-1)


# -- on a real server -----------------------------------------------------------------------


def test_ids_are_the_servers_exactly(server: EclectusServer, llm: Eclectus) -> None:
    """Cached or not, the ids are what the engine's tokenizer makes of one segment."""
    engine_tokenizer = server.backend.engine.tokenizer  # type: ignore[attr-defined]
    for text in TEXTS + TEXTS:
        assert llm.tokenizer(text) == engine_tokenizer.encode(text, add_special_tokens=False)
    assert llm.tokenizer("abc") == tiny_ids("abc")


def test_a_repeated_text_sends_no_frame(llm: Eclectus) -> None:
    llm.tokenizer("warm up the session")
    before = llm.client.num_frames_sent
    for text in TEXTS:
        llm.tokenizer(text)
    assert llm.client.num_frames_sent - before == len(set(TEXTS))
    for text in TEXTS:
        llm.tokenizer(text)
    assert llm.client.num_frames_sent - before == len(set(TEXTS))


def test_threads_share_the_cache(llm: Eclectus) -> None:
    """LlamaIndex counts from worker threads too: every answer stays exact, and a text is
    fetched at most once per thread that missed it at the same moment."""
    texts = [f"word {i % 7}" for i in range(56)]
    llm.tokenizer("warm up the session")
    before = llm.client.num_frames_sent
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(llm.tokenizer, texts))
    assert answers == [tiny_ids(t) for t in texts]
    assert len(set(texts)) <= llm.client.num_frames_sent - before <= 8 * len(set(texts))
    after = llm.client.num_frames_sent
    assert [llm.tokenizer(t) for t in set(texts)] == [tiny_ids(t) for t in set(texts)]
    assert llm.client.num_frames_sent == after


def test_a_reconnect_starts_a_fresh_cache(llm: Eclectus) -> None:
    """After the session closes the server may be another one: ask again."""
    llm.tokenizer("abc")
    llm.close()
    before = llm.client.num_frames_sent
    assert llm.tokenizer("abc") == tiny_ids("abc")
    assert llm.client.num_frames_sent == before + 1


def test_another_model_starts_a_fresh_cache(llm: Eclectus) -> None:
    """The ids are the model's: naming another model asks the server again."""
    llm.tokenizer("abc")
    before = llm.client.num_frames_sent
    llm.model = "tiny"  # was None (the server's first)
    assert llm.tokenizer("abc") == tiny_ids("abc")
    assert llm.client.num_frames_sent == before + 1


def test_cache_off_is_a_round_trip_per_call(server: EclectusServer) -> None:
    uncached = Eclectus(url=server.url, tokenizer_cache_tokens=0)
    try:
        uncached.tokenizer("abc")
        before = uncached.client.num_frames_sent
        uncached.tokenizer("abc")
        assert uncached.client.num_frames_sent == before + 1
    finally:
        uncached.close()


def test_non_text_is_refused(llm: Eclectus) -> None:
    with pytest.raises(TypeError, match="str"):
        llm.tokenizer(b"abc")  # type: ignore[arg-type]


@pytest.fixture
def restore_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Put LlamaIndex's global Settings (and its module-level tokenizer) back afterwards."""
    monkeypatch.setattr(llama_index.core, "global_tokenizer", llama_index.core.global_tokenizer)
    for name in ("_llm", "_embed_model", "_node_parser", "_transformations"):
        monkeypatch.setattr(Settings, name, getattr(Settings, name))
    yield


def summary_app(llm: Eclectus, docs_dir: Path) -> tuple[list[str], str, list[str]]:
    """Build a SummaryIndex with ``llm`` as LlamaIndex's LLM and tokenizer, query it with the
    graph TreeSummarize: (chunks, answer, every text LlamaIndex counted)."""
    counted = Counting(llm.tokenizer)
    Settings.llm = llm
    Settings.tokenizer = counted
    Settings.node_parser = SentenceSplitter(chunk_size=256, chunk_overlap=16)
    Settings.transformations = [Settings.node_parser]
    index = SummaryIndex.from_documents(SimpleDirectoryReader(str(docs_dir)).load_data())
    engine = index.as_query_engine(
        response_synthesizer=get_response_synthesizer(response_mode="tree_summarize")
    )
    answer = str(engine.query("What happens at the harbor?"))
    chunks = [node.get_content() for node in index.docstore.docs.values()]
    return chunks, answer, counted.asked


def test_a_summary_index_counts_each_distinct_text_once(
    server: EclectusServer, tmp_path: Path, restore_settings: None
) -> None:
    """A SummaryIndex build and tree_summarize query count the same words and chunks many
    times (PromptHelper's repack splits at every space); with the cache each distinct text
    costs one tokenize frame, and chunks and answer are those of the uncached tokenizer."""
    sentences = [f"Boat {i} leaves the harbor at {i % 5 + 4} in the morning. " for i in range(40)]
    (tmp_path / "harbor.txt").write_text("".join(sentences))
    runs = {}
    for cache_tokens in (0, 1 << 18):
        llm = Eclectus(
            url=server.url, max_tokens=8, context_window=600, tokenizer_cache_tokens=cache_tokens
        )
        try:
            _ = llm.metadata
            before = llm.client.num_frames_sent
            chunks, answer, counted = summary_app(llm, tmp_path)
            runs[cache_tokens] = (chunks, answer, counted, llm.client.num_frames_sent - before)
        finally:
            llm.close()
    chunks, answer, counted, frames_off = runs[0]
    assert runs[1 << 18][:3] == (chunks, answer, counted)
    assert len(chunks) > 3 and len(counted) > 4 * len(set(counted))
    frames_on = runs[1 << 18][3]
    assert frames_off - frames_on == len(counted) - len(set(counted))
