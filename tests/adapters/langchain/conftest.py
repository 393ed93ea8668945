"""One real Eclectus server (built-in engine, embedded ``tiny`` model) for this package's
tests, started once per test session on a free loopback port.

The model classes read ``ECLECTUS_URL`` when constructed, so the fixture points that at the
server for the tests that use it (``usefixtures("eclectus_server")``).
"""

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
