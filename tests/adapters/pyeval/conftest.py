"""One real Eclectus server (built-in engine, embedded ``tiny`` model) for the evaluator's
live tests, started once per test session; ECLECTUS_URL points at it while they run."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from eclectus.server.app import EclectusServer, serve_in_thread
from eclectus.server.config import ServerConfig


@pytest.fixture(scope="session")
def eclectus_server() -> Iterator[EclectusServer]:
    with serve_in_thread(ServerConfig(port=0, model="tiny")) as server:
        previous = os.environ.get("ECLECTUS_URL")
        os.environ["ECLECTUS_URL"] = server.url
        try:
            yield server
        finally:
            if previous is None:
                os.environ.pop("ECLECTUS_URL", None)
            else:
                os.environ["ECLECTUS_URL"] = previous
