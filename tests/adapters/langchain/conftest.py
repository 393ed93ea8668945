"""One real Eclectus server (built-in engine, embedded ``tiny`` model) for this package's
tests, started once per test session on a free loopback port.

The model classes read ``ECLECTUS_URL`` when constructed, so the fixture points that at the
server for the tests that use it (``usefixtures("eclectus_server")``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from eclectus.server.app import EclectusServer, serve_in_thread
from eclectus.server.config import ServerConfig


@pytest.fixture(scope="session")
def eclectus_server() -> Iterator[EclectusServer]:
    """The running server; ECLECTUS_URL points at it while the session lasts."""
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
