"""Fixtures for the SDK tests: a recording protocol peer (unit tests) and the real server
with its built-in engine (integration tests, started once per test session)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from client_live import LiveServer, serve_live
from client_peer import FakePeer

from eclectus.adapters.client import Session, connect


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
