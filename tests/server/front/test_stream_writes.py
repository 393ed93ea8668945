"""A /v1 stream's writes: the events of every chunk already queued when the response task
runs go out in one write (one ASGI send, one syscall), with the same bytes as one write
each; a chunk that arrives alone is written alone, at once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from eclectus.protocol import Usage
from eclectus.protocol.openai_tools import ChatConstraint
from eclectus.server.front.openai_api import OpenAIApi, _Job
from eclectus.server.graph.graph import Variable, VarState


class _Handle:
    """What ``_finish`` needs of an app handle: ``close``."""

    closed: str | None = None

    async def close(self, message: str) -> None:
        self.closed = message


def _api() -> OpenAIApi:
    api = OpenAIApi.__new__(OpenAIApi)  # _stream reads nothing of the server's context
    api.jobs = set()
    return api


def _final() -> Variable:
    usage = Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=0)
    return Variable("out0", state=VarState.READY, value="ab", usage=usage, finish_reason="stop")


def _events(writes: list[bytes]) -> list[Any]:
    """The SSE events' data in order (pure)."""
    data = b"".join(writes).decode().split("\n\n")
    return [d.removeprefix("data: ") for d in data if d]


def _untimed(writes: list[bytes]) -> list[Any]:
    """The events with their ``created`` second dropped (pure)."""
    events = [json.loads(e) for e in _events(writes)[:-1]]
    return [{k: v for k, v in e.items() if k != "created"} for e in events]


def _stream(api: OpenAIApi, job: _Job) -> Any:
    return api._stream(job, "cmpl-1", "tiny", False, True, ChatConstraint(), with_ids=True)


async def test_chunks_queued_together_go_out_in_one_write() -> None:
    job = _Job(_Handle(), ["out0"], streaming=True)  # type: ignore[arg-type]
    for text, ids in (("a", (1,)), ("b", (2,))):
        job.chunks.put_nowait((0, text, ids))
    job.chunks.put_nowait(_final())
    writes = [w async for w in _stream(_api(), job)]
    assert len(writes) == 1
    events = _events(writes)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:3]] == ["a", "b", ""]
    assert [c["choices"][0]["token_ids"] for c in chunks[:2]] == [[1], [2]]
    assert chunks[2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[3]["usage"]["completion_tokens"] == 2
    assert job.handle.closed is not None  # type: ignore[attr-defined]


async def test_a_chunk_that_comes_alone_is_written_at_once_and_the_bytes_match() -> None:
    together = _Job(_Handle(), ["out0"], streaming=True)  # type: ignore[arg-type]
    alone = _Job(_Handle(), ["out0"], streaming=True)  # type: ignore[arg-type]
    parts = [(0, "a", (1,)), (0, "b", (2,))]
    for part in parts:
        together.chunks.put_nowait(part)
    together.chunks.put_nowait(_final())
    batched = [w async for w in _stream(_api(), together)]

    stream = _stream(_api(), alone)
    writes = []
    for part in parts:
        alone.chunks.put_nowait(part)
        writes.append(await asyncio.wait_for(anext(stream), 1.0))  # not held for more
    alone.chunks.put_nowait(_final())
    writes += [w async for w in stream]
    assert len(writes) == 3
    assert _untimed(writes) == _untimed(batched)
