"""Fixtures of the remote-engine tests: real ``eclectus serve`` engines, and the built-in
engine the remote results are compared with (each module-scoped: started once per module)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from remote_helpers import EngineProcess, start_engines


@pytest.fixture(scope="module")
def engines() -> Iterator[list[EngineProcess]]:
    procs = start_engines(2)
    yield procs
    for proc in procs:
        proc.stop()


@pytest.fixture(scope="module")
def builtin() -> Iterator[object]:
    from eclectus.server.engine import AsyncEngine

    engine = AsyncEngine.from_config(model="tiny", num_kv_blocks=512, num_threads=1)
    yield engine
    asyncio.run(engine.shutdown())
