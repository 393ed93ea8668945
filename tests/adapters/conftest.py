"""Fixtures for the SDK and adapter tests: a recording protocol peer (unit tests) and the real
server with its built-in engine (integration tests, started once per test session).

``eclectus_server`` is one server for langchain/, langgraph/ and pyeval/ alike: it points
``ECLECTUS_URL`` at itself for the session, and one such patch per folder would point every
folder at whichever server started last once pytest-xdist interleaves their files.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from client_live import LiveServer, serve_as_default, serve_live
from client_peer import FakePeer

from eclectus.adapters.client import Session, connect
from eclectus.server.front.app import EclectusServer


@pytest.fixture
def peer() -> Iterator[FakePeer]:
    """A fresh recording peer; the test fails if the client sent an invalid frame."""
    fake = FakePeer()
    with fake.running():
        yield fake
    assert not fake.invalid, fake.invalid


@pytest.fixture
async def peer_app(peer: FakePeer) -> AsyncIterator[Session]:
    """An async session connected to ``peer``."""
    async with connect(peer.url, timeout=5) as app:
        yield app


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    """The real server with the real tiny engine (auth on: use ``live_server.token``),
    started once for the whole test session on its own loop thread, so sync and async tests
    on any loop can share it."""
    with serve_live() as server:
        yield server


@pytest.fixture(scope="session")
def eclectus_server() -> Iterator[EclectusServer]:
    """The running server (no auth, built-in tiny engine); ECLECTUS_URL points at it while
    the session lasts: the adapters' model classes read it when constructed."""
    with serve_as_default() as server:
        yield server
