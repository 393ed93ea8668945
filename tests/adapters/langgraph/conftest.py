"""One real Eclectus server (built-in engine, embedded ``tiny`` model) for the LangGraph
tests, started once per test session; ECLECTUS_URL points at it while they run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from client_live import serve_as_default

from eclectus.server.front.app import EclectusServer


@pytest.fixture(scope="session")
def eclectus_server() -> Iterator[EclectusServer]:
    """The running server; ECLECTUS_URL points at it while the session lasts."""
    with serve_as_default() as server:
        yield server
