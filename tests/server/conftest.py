"""Fixtures for server tests: a real server on a free loopback port, and a raw client; for the
slow tests, the built-in engine on the tiny model and a server over it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from scripted_engine import FRONT, ScriptedEngine
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, start_server
from eclectus.server.front.prompt import Front


@pytest.fixture
async def make_server() -> AsyncIterator[ServerFactory]:
    servers: list[EclectusServer] = []

    async def factory(
        engine: ScriptedEngine | None = None, *, front: Front = FRONT, **config: Any
    ) -> EclectusServer:
        server = await start_server(
            ServerConfig(port=0, **config),
            engine or ScriptedEngine(),
            owns_backend=True,
            front=front,
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


@pytest.fixture(scope="module")
def real_engine() -> Iterator[Any]:
    """The built-in engine (AsyncEngine, tiny model), built once per module: slow to build."""
    from eclectus.server.engine import AsyncEngine

    engine = AsyncEngine.from_config(model="tiny", num_kv_blocks=256)
    yield engine
    asyncio.run(engine.shutdown())


@pytest.fixture
async def real_server(real_engine: Any) -> AsyncIterator[EclectusServer]:
    """A server with the default config over ``real_engine`` (which outlives it)."""
    server = await start_server(ServerConfig(port=0), real_engine, owns_backend=False)
    yield server
    await server.close()
