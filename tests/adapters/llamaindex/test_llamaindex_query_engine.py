"""Whole LlamaIndex apps: ``Settings.llm = Eclectus(...)``, local documents, query engines.

Indexes are built from files on disk with SimpleDirectoryReader; embeddings come from
LlamaIndex's MockEmbedding (no network). Each graph-synthesizer query engine is compared
with the stock one over the same index and retriever.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_index.core import (
    Settings,
    SimpleDirectoryReader,
    SummaryIndex,
    VectorStoreIndex,
)
from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.node_parser import SentenceSplitter
from llamaindex_support import client_frames

from eclectus.adapters.llamaindex import Eclectus, get_response_synthesizer
from eclectus.server.front.app import EclectusServer

NOTES = {
    "harbor.txt": "The harbor opens at dawn. Fishing boats leave before the fog lifts. " * 8,
    "orchard.txt": "The orchard grows apples and pears. Pickers arrive in late summer. " * 8,
    "signal.txt": "The lighthouse signal flashes every ten seconds across the bay. " * 8,
}
QUESTION = "What happens at the harbor?"


@pytest.fixture
def documents(tmp_path: Path) -> list:
    for name, text in NOTES.items():
        (tmp_path / name).write_text(text)
    return SimpleDirectoryReader(str(tmp_path)).load_data()


@pytest.fixture
def app_settings(server: EclectusServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Eclectus]:
    """Settings.llm is an Eclectus LLM and embeddings are local, for this test only."""
    for name in ("_llm", "_embed_model", "_node_parser"):
        monkeypatch.setattr(Settings, name, getattr(Settings, name))
    llm = Eclectus(url=server.url, max_tokens=12, context_window=900)
    Settings.llm = llm
    Settings.embed_model = MockEmbedding(embed_dim=8)
    Settings.node_parser = SentenceSplitter(chunk_size=96, chunk_overlap=0)
    yield llm
    llm.close()


def test_summary_index_tree_summarize(
    server: EclectusServer, app_settings: Eclectus, documents: list
) -> None:
    """A SummaryIndex query with the graph TreeSummarize answers as the stock one does, in
    one round trip where the stock one needs a call per leaf and one for the root."""
    app_settings.context_window = 400  # several leaves under the root
    index = SummaryIndex.from_documents(documents)
    stock_engine = index.as_query_engine(response_mode="tree_summarize")
    our_engine = index.as_query_engine(
        response_synthesizer=get_response_synthesizer(response_mode="tree_summarize")
    )
    before = client_frames(server)
    stock = stock_engine.query(QUESTION)
    middle = client_frames(server)
    ours = our_engine.query(QUESTION)
    assert middle - before >= 3
    assert client_frames(server) - middle == 1
    assert len(ours.source_nodes) == len(stock.source_nodes) > 3
    assert ours.response == stock.response
    assert ours.response


async def test_vector_index_compact_async(
    server: EclectusServer, app_settings: Eclectus, documents: list
) -> None:
    """VectorStoreIndex (MockEmbedding) with the default compact mode, queried async."""
    app_settings.context_window = 640  # the 4 nodes compact into 2 chunks: a 2-step chain
    index = VectorStoreIndex.from_documents(documents)
    before = client_frames(server)
    stock = await index.as_query_engine(similarity_top_k=4).aquery(QUESTION)
    assert client_frames(server) - before >= 2
    ours = await index.as_query_engine(
        similarity_top_k=4, response_synthesizer=get_response_synthesizer()
    ).aquery(QUESTION)
    assert [n.node.node_id for n in ours.source_nodes] == [
        n.node.node_id for n in stock.source_nodes
    ]
    assert ours.response == stock.response
    assert ours.response


def test_vector_index_refine_streaming(app_settings: Eclectus, documents: list) -> None:
    """Streaming query: the graph refine chain streams the same final answer."""
    index = VectorStoreIndex.from_documents(documents)
    stock = index.as_query_engine(similarity_top_k=3, response_mode="refine", streaming=True).query(
        QUESTION
    )
    ours = index.as_query_engine(
        similarity_top_k=3,
        response_synthesizer=get_response_synthesizer(response_mode="refine", streaming=True),
    ).query(QUESTION)
    assert isinstance(stock, StreamingResponse) and isinstance(ours, StreamingResponse)
    assert "".join(ours.response_gen) == "".join(stock.response_gen)


async def test_vector_index_tree_async_streaming(app_settings: Eclectus, documents: list) -> None:
    """Async streaming query over a two-level tree: the root streams after its leaves."""
    app_settings.context_window = 400
    index = VectorStoreIndex.from_documents(documents)
    stock = await index.as_query_engine(
        similarity_top_k=4, response_mode="tree_summarize", streaming=True
    ).aquery(QUESTION)
    ours = await index.as_query_engine(
        similarity_top_k=4,
        response_synthesizer=get_response_synthesizer(
            response_mode="tree_summarize", streaming=True
        ),
    ).aquery(QUESTION)
    assert isinstance(ours, AsyncStreamingResponse)
    assert isinstance(stock, AsyncStreamingResponse)
    got = "".join([t async for t in ours.async_response_gen()])
    want = "".join([t async for t in stock.async_response_gen()])
    assert got == want


def test_long_document_packs_in_the_servers_tokens(
    server: EclectusServer, app_settings: Eclectus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``Settings.tokenizer = llm.tokenizer`` LlamaIndex packs a long document in the
    model's own tokens, so no leaf overflows the server's window (tiktoken's counts are
    another tokenizer's)."""
    import llama_index.core

    from eclectus.recipes.text import load_sample

    # Settings.tokenizer sets a module global: put it back for the tests that follow
    monkeypatch.setattr(llama_index.core, "global_tokenizer", llama_index.core.global_tokenizer)
    Settings.tokenizer = app_settings.tokenizer
    app_settings.context_window = None  # the server's real window
    # 256 of tiny's BPE tokens (~0.8 KB of English): the 17.5 KB essay makes 16+ leaves
    Settings.node_parser = SentenceSplitter(chunk_size=256, chunk_overlap=0)
    (tmp_path / "essay.md").write_text(load_sample("history-essay"))
    index = SummaryIndex.from_documents(SimpleDirectoryReader(str(tmp_path)).load_data())
    synthesizer = get_response_synthesizer(response_mode="tree_summarize")
    response = index.as_query_engine(response_synthesizer=synthesizer).query(QUESTION)
    assert len(response.source_nodes) >= 16
    engine_tokenizer = server.backend.engine.tokenizer  # type: ignore[attr-defined]
    assert app_settings.tokenizer("abc") == engine_tokenizer.encode("abc", add_special_tokens=False)
    assert isinstance(response.response, str)
