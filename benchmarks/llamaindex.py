"""Tokenizer round trips of a LlamaIndex app: ``Settings.tokenizer = llm.tokenizer`` with
the token cache off (one ``tokenize`` frame per count, the baseline) and on (the default).

    python -m eclectus.benchmarks.llamaindex [--sample history-essay] [--repeats 3]

Starts the built-in server with the ``tiny`` model in this process. Each run is a fresh
``Eclectus`` (a fresh session and an empty cache) that builds a SummaryIndex and a
VectorStoreIndex over one bundled sample document (recipes/data, LlamaIndex's default
SentenceSplitter, MockEmbedding) and queries each: tree_summarize over the SummaryIndex, the
default (compact) engine over the VectorStoreIndex, both with this package's graph
synthesizers. Runs alternate between the two modes; frames are the session's own count
(every frame after hello: tokenize, submit, get...), identical run to run, and the time is
the best of ``--repeats``. Both modes must give the same answers and the same chunks.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llama_index.core import Settings, SimpleDirectoryReader, SummaryIndex, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.indices.base import BaseIndex
from llama_index.core.node_parser import SentenceSplitter

from eclectus.adapters.llamaindex.llm import DEFAULT_TOKENIZER_CACHE_TOKENS, Eclectus
from eclectus.adapters.llamaindex.synthesizers import get_response_synthesizer
from eclectus.benchmarks.server import server_url

QUESTION = "How did the railways change the way towns kept time?"
PHASES = ("summary build", "summary query", "vector build", "vector query")


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of one run: frames the session sent, seconds, and what it produced."""

    num_frames: int
    seconds: float
    result: str


def _timed(llm: Eclectus, step: Callable[[], str]) -> Phase:
    before = llm.client.num_frames_sent
    start = time.perf_counter()
    result = step()
    return Phase(llm.client.num_frames_sent - before, time.perf_counter() - start, result)


def _query(index: BaseIndex, mode: str) -> str:
    engine = index.as_query_engine(response_synthesizer=get_response_synthesizer(mode))
    return str(engine.query(QUESTION))


def run_once(url: str, docs_dir: Path, cache_tokens: int, max_tokens: int) -> list[Phase]:
    """Build and query both indexes with a fresh LLM whose cache holds ``cache_tokens``
    (mutates LlamaIndex's global Settings: llm, tokenizer, embed_model, node_parser,
    transformations)."""
    llm = Eclectus(url=url, max_tokens=max_tokens, tokenizer_cache_tokens=cache_tokens)
    try:
        Settings.llm = llm
        Settings.tokenizer = llm.tokenizer
        Settings.embed_model = MockEmbedding(embed_dim=8)
        # LlamaIndex's default splitter, made now: it takes Settings.tokenizer when built
        # (Settings keeps the first one it makes, in transformations too)
        # node ids from the chunk's place, not uuid4: MockEmbedding ties every similarity,
        # and ids break the ties, so retrieval is the same run to run
        Settings.node_parser = SentenceSplitter(id_func=lambda i, doc: f"{doc.id_}-{i}")
        Settings.transformations = [Settings.node_parser]
        _ = llm.metadata  # connect outside the timed phases
        docs = SimpleDirectoryReader(str(docs_dir), filename_as_id=True).load_data()
        indexes: dict[str, BaseIndex] = {}

        def build(kind: str) -> Callable[[], str]:
            def step() -> str:
                cls = SummaryIndex if kind == "summary" else VectorStoreIndex
                indexes[kind] = cls.from_documents(docs)
                return "|".join(n.get_content() for n in indexes[kind].docstore.docs.values())

            return step

        return [
            _timed(llm, build("summary")),
            _timed(llm, lambda: _query(indexes["summary"], "tree_summarize")),
            _timed(llm, build("vector")),
            _timed(llm, lambda: _query(indexes["vector"], "compact")),
        ]
    finally:
        llm.close()


def main(argv: list[str] | None = None) -> None:
    from eclectus.recipes.text import load_sample

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", default="history-essay", help="a recipes/data document")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode (best time)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per LLM call")
    args = parser.parse_args(argv)
    modes = {"off": 0, "on": DEFAULT_TOKENIZER_CACHE_TOKENS}
    runs: dict[str, list[list[Phase]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp, server_url(None) as url:
        docs_dir = Path(tmp)
        (docs_dir / f"{args.sample}.md").write_text(load_sample(args.sample), encoding="utf-8")
        for _ in range(args.repeats):
            for mode, cache_tokens in modes.items():  # interleaved: off, on, off, on...
                runs[mode].append(run_once(url, docs_dir, cache_tokens, args.max_tokens))
    print(f"sample {args.sample!r}, tiny model, best of {args.repeats} runs per mode")
    print(f"{'phase':<14} {'frames off':>10} {'on':>6} {'ratio':>7} {'s off':>7} {'s on':>7} ratio")
    for i, name in enumerate(PHASES):
        off = [run[i] for run in runs["off"]]
        on = [run[i] for run in runs["on"]]
        if {p.result for p in off} != {p.result for p in on} or len({p.result for p in on}) != 1:
            raise RuntimeError(f"{name}: the cache changed what LlamaIndex produced")
        frames_off, frames_on = off[0].num_frames, on[0].num_frames
        t_off, t_on = min(p.seconds for p in off), min(p.seconds for p in on)
        print(
            f"{name:<14} {frames_off:>10} {frames_on:>6} {frames_off / max(frames_on, 1):>6.1f}x"
            f" {t_off:>7.2f} {t_on:>7.2f} {t_off / t_on:.2f}x"
        )


if __name__ == "__main__":
    main()
