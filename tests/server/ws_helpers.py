"""Helpers for socket tests: a raw JSON-frame client and a map-reduce frame builder."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import ClientConnection

from eclectus.server.front.app import EclectusServer

Frame = dict[str, Any]


class RawClient:
    """JSON frames over a plain websockets connection (no SDK)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, frame: Frame | str) -> None:
        await self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self, timeout: float = 5.0) -> Frame:
        return json.loads(await asyncio.wait_for(self.ws.recv(), timeout))

    async def ask(self, frame: Frame | str) -> Frame:
        await self.send(frame)
        return await self.recv()

    async def hello(self, **fields: Any) -> Frame:
        welcome = await self.ask({"type": "hello", **fields})
        assert welcome["type"] == "welcome", welcome
        return welcome

    async def values(self, num: int) -> dict[str, Frame]:
        """Read frames until ``num`` value/error answers arrived; var -> frame."""
        answers: dict[str, Frame] = {}
        while len(answers) < num:
            frame = await self.recv()
            if frame["type"] in ("value", "error") and "var" in frame:
                answers[frame["var"]] = frame
        return answers


ServerFactory = Callable[..., Awaitable[EclectusServer]]


def map_reduce(num_maps: int, criteria: str = "latency") -> Frame:
    """A submit frame: num_maps summaries of constant docs, one combine over a join."""
    frame: Frame = {"type": "submit", "id": "s1", "vars": [], "calls": [], "ops": []}
    for i in range(num_maps):
        frame["vars"].append({"id": f"doc{i}", "value": f"document number {i}"})
        frame["calls"].append(
            {
                "id": f"map{i}",
                "template": "Summarize:\n{{doc}}\nSummary:{{summary}}",
                "bind": {"doc": f"doc{i}", "summary": f"sum{i}"},
                "sampling": {"summary": {"max_tokens": 8}},
            }
        )
    frame["ops"].append(
        {
            "id": "j",
            "op": "join",
            "inputs": [f"sum{i}" for i in range(num_maps)],
            "output": "joined",
            "sep": "\n",
        }
    )
    frame["calls"].append(
        {
            "id": "reduce",
            "template": "Combine:\n{{all}}\nFinal:{{final}}",
            "bind": {"all": "joined", "final": "final"},
            "sampling": {"final": {"max_tokens": 8}},
        }
    )
    frame["gets"] = [{"var": "final", "criteria": criteria}]
    return frame
