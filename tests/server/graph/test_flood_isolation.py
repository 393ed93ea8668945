"""Two tenants over real sockets on the built-in engine, one flooding: the other's programs
still finish in the order they arrived, each within a bounded share of the engine's work
(the per-tenant share and admission keep the flood's backlog in the scheduler's queue)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import connect
from ws_helpers import RawClient

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, start_server

pytestmark = pytest.mark.slow

TOKENS = (("flood", "flood-token"), ("calm", "calm-token"))
FLOOD_SESSIONS, FLOOD_CALLS = 6, 8


@pytest.fixture
async def shared_server(real_engine: Any) -> AsyncIterator[EclectusServer]:
    config = ServerConfig(
        port=0, tenant_tokens=TOKENS, max_inflight_per_tenant=2, max_engine_seqs=4
    )
    server = await start_server(config, real_engine, owns_backend=False)
    yield server
    await server.close()


def gen(var: str, tokens: int) -> dict[str, Any]:
    return {"gen": var, "sampling": {"max_tokens": tokens, "ignore_eos": True}}


def flood_frame(session: int) -> dict[str, Any]:
    calls = [
        {"id": f"f{i}", "segments": [{"text": f"Flood {session} item {i}: "}, gen(f"v{i}", 24)]}
        for i in range(FLOOD_CALLS)
    ]
    return {"type": "submit", "id": "s", "calls": calls,
            "gets": [{"var": f"v{i}"} for i in range(FLOOD_CALLS)]}  # fmt: skip


def calm_frame(program: int) -> dict[str, Any]:
    """A two-step chain: the second step reads the first's output."""
    first = {"id": "c0", "segments": [{"text": f"Question {program}: "}, gen("a", 6)]}
    second = {"id": "c1", "segments": [{"text": "Then: "}, {"var": "a"}, gen("b", 6)]}
    return {"type": "submit", "id": "s", "calls": [first, second], "gets": [{"var": "b"}]}


async def session(server: EclectusServer, token: str) -> tuple[RawClient, Any, str]:
    ws = await connect(server.url)
    client = RawClient(ws)
    welcome = await client.hello(token=token)
    return client, ws, welcome["session"]


async def run_flood(server: EclectusServer) -> None:
    async def one(i: int) -> None:
        client, ws, _ = await session(server, "flood-token")
        async with ws:
            assert (await client.ask(flood_frame(i)))["type"] == "ack"
            answers = await client.values(FLOOD_CALLS)
            assert all(a["type"] == "value" for a in answers.values())

    await asyncio.gather(*(one(i) for i in range(FLOOD_SESSIONS)))


async def test_a_flooding_tenant_does_not_hold_up_the_others(
    shared_server: EclectusServer,
) -> None:
    sched = shared_server.scheduler
    flood = asyncio.create_task(run_flood(shared_server))
    while len(sched.queue) < FLOOD_SESSIONS * FLOOD_CALLS - 8:  # the backlog is queued
        await asyncio.sleep(0.01)
    flood_ids = {a.session_id for a in sched._apps.values() if a.tenant == "flood"}
    finished: list[int] = []
    sessions: dict[int, str] = {}

    async def calm(program: int) -> None:
        await asyncio.sleep(0.05 * program)  # arrivals in order, 50 ms apart
        client, ws, sessions[program] = await session(shared_server, "calm-token")
        async with ws:
            assert (await client.ask(calm_frame(program)))["type"] == "ack"
            answer = (await client.values(1))["b"]
            assert answer["type"] == "value", answer
            finished.append(program)

    await asyncio.wait_for(asyncio.gather(*(calm(p) for p in range(4))), timeout=120)
    assert not flood.done()  # the calm programs finished while the flood still ran
    await asyncio.wait_for(flood, timeout=300)
    assert finished == [0, 1, 2, 3]
    log = list(sched.dispatch_log)
    for program, session_id in sessions.items():
        mine = [i for i, (s, _) in enumerate(log) if s == session_id]
        assert len(mine) == 2, (program, mine)
        # while its second step waits, the flood gets at most a few of the slots that free
        between = sum(1 for s, _ in log[mine[0] : mine[1]] if s in flood_ids)
        assert between <= 8, (program, between)
