"""One real Eclectus server (built-in engine, ``tiny`` model) for the whole LlamaIndex suite.

Starting the engine costs seconds, so the server is session-scoped; each test gets its own
``Eclectus`` LLM, i.e. its own application session on that server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from client_live import guaranteed_engine
from llamaindex_support import TEST_CONTEXT_WINDOW, TEST_MAX_TOKENS

from eclectus.adapters.llamaindex import Eclectus
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, serve_in_thread


@pytest.fixture(scope="session")
def server() -> Iterator[EclectusServer]:
    with serve_in_thread(ServerConfig(port=0, model="tiny"), guaranteed_engine) as running:
        yield running


@pytest.fixture
def llm(server: EclectusServer) -> Iterator[Eclectus]:
    model = Eclectus(
        url=server.url,
        max_tokens=TEST_MAX_TOKENS,
        context_window=TEST_CONTEXT_WINDOW,
        app="llamaindex-tests",
    )
    yield model
    model.close()
