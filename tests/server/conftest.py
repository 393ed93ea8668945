"""Fixtures for server tests: a real server on a free loopback port, and a raw client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from scripted_engine import ScriptedEngine
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.server.app import EclectusServer, start_server
from eclectus.server.config import ServerConfig


@pytest.fixture
async def make_server() -> AsyncIterator[ServerFactory]:
    servers: list[EclectusServer] = []

    async def factory(engine: ScriptedEngine | None = None, **config: Any) -> EclectusServer:
        server = await start_server(
            ServerConfig(port=0, **config), engine or ScriptedEngine(), owns_backend=True
        )
        servers.append(server)
        return server

    yield factory
    for server in servers:
        await server.close()


@pytest.fixture
async def engine() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture
async def server(make_server: ServerFactory, engine: ScriptedEngine) -> EclectusServer:
    return await make_server(engine)


@pytest.fixture
async def client(server: EclectusServer) -> AsyncIterator[RawClient]:
    async with connect(server.url) as ws:
        raw = RawClient(ws)
        await raw.hello()
        yield raw
