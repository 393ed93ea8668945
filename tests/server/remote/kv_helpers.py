"""A real ZeroMQ publisher for the KV event tests, fed recorded batches.

It speaks vLLM's transport (protocol/kv_events.py): an XPUB socket (a PUB that also tells when
a subscriber has joined, so a test never publishes into the void) sends ``(topic, seq,
payload)``, and a ROUTER socket answers replay requests from what it keeps. A test chooses
which sequence numbers go out live and which the replay holds, to make gaps.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from eclectus.protocol.kv_events import END_SEQ, seq_bytes, seq_of

RECORDED = Path(__file__).parents[2] / "fixtures" / "vllm_kv_events.msgpack"


def recorded() -> dict[str, Any]:
    """What tests/fixtures/record_vllm_kv_events.py recorded from vLLM 0.32: its block size,
    the prompts sent and every frame vLLM published, as ``[seq, payload]``."""
    return msgspec.msgpack.decode(RECORDED.read_bytes())


class ScriptedPublisher:
    """Publishes chosen batches on ``tcp://127.0.0.1:PORT``; replays what it ``keep``\\ s."""

    def __init__(self, pub_port: int, replay_port: int) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://127.0.0.1:{pub_port}")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"tcp://127.0.0.1:{replay_port}")
        self.kept: dict[int, bytes] = {}
        self.num_replay_requests = 0
        self._replays = asyncio.get_running_loop().create_task(self._serve_replays())

    async def wait_subscriber(self) -> None:
        """Until a subscriber has subscribed (XPUB passes its subscription up)."""
        frame = await asyncio.wait_for(self.pub.recv(), 10)
        assert frame[:1] == b"\x01", frame

    async def send(self, seq: int, payload: bytes, *, keep: bool = True) -> None:
        """Publish batch ``seq`` live (and keep it for replay unless ``keep`` is False)."""
        if keep:
            self.kept[seq] = payload
        await self.pub.send_multipart((b"", seq_bytes(seq), payload))

    async def close(self) -> None:
        self._replays.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._replays
        self.ctx.destroy(linger=0)

    async def _serve_replays(self) -> None:
        while True:
            client, empty, start = await self.router.recv_multipart()
            self.num_replay_requests += 1
            for seq in sorted(self.kept):
                if seq >= seq_of(start):
                    frames = (client, empty, b"", seq_bytes(seq), self.kept[seq])
                    await self.router.send_multipart(frames)
            await self.router.send_multipart((client, empty, b"", seq_bytes(END_SEQ), b""))
