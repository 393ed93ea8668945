"""End to end over a real socket with the scripted engine: a map-reduce graph."""

from __future__ import annotations

from scripted_engine import ScriptedEngine, scripted_text
from ws_helpers import RawClient, map_reduce

from eclectus.server.front.app import EclectusServer


async def test_map_reduce_resolves_on_server(
    client: RawClient, server: EclectusServer, engine: ScriptedEngine
) -> None:
    """The final value equals running the calls one by one; no intermediate is sent."""
    ack = await client.ask(map_reduce(4))
    assert ack == {"type": "ack", "id": "s1"}
    answers = await client.values(1)
    sums = [scripted_text(f"Summarize:\ndocument number {i}\nSummary:", 8) for i in range(4)]
    expected = scripted_text("Combine:\n" + "\n".join(sums) + "\nFinal:", 8)
    assert answers["final"]["text"] == expected
    assert server.metrics.values_sent == 1
    assert len(engine.requests) == 5
