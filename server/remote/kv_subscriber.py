"""One engine's KV events, followed live: a ZMQ subscriber that keeps a BlockIndex in step.

Sequence rules (the publisher numbers its batches 0, 1, 2, ... and keeps the last ones for
replay; eclectus/protocol/kv_events.py):

- **In order**: batch ``last + 1`` is applied.
- **A gap** (``seq > last + 1``: the PUB socket dropped batches at its high-water mark, or
  the subscriber joined late or lost its connection for a while): the missing batches are
  asked of the replay socket and applied first. When the replay cannot give all of them
  (no replay endpoint, no answer within ``replay_timeout_s``, or the buffer no longer holds
  the first), removals may have been lost, so the index is cleared and filled afresh from
  what comes next (counted as ``num_lost``).
- **A restart** (the live stream's ``seq`` goes back: a new publisher, i.e. the engine
  restarted, with an empty cache): the index is cleared and the new stream followed from 0.
  ZeroMQ reconnects by itself, so a lost connection to an engine that comes back is seen
  here either as a gap (same publisher) or as a restart (new one).
- **A duplicate** (a batch the replay already gave, arriving late on the live socket) is
  skipped.

``live`` says whether the index may be used for routing: a batch has arrived since the
subscriber started or was told the engine is down (:meth:`forget`); until then the pool
routes this engine by its prediction (prefix_index.py), as for an engine without events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio

from eclectus.protocol.kv_events import END_SEQ, decode_batch, seq_bytes, seq_of
from eclectus.server.remote.kv_index import BlockIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KVEventsEndpoint:
    """Where an engine publishes: its PUB endpoint and its replay (ROUTER) endpoint, as a
    subscriber connects to them (``tcp://host:port``), and the topic."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""

    @classmethod
    def parse(cls, text: str) -> KVEventsEndpoint:
        """``PUB[,REPLAY]`` (``--engine-kv-events``); ValueError naming what is wrong."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) > 2 or not all(p.startswith(("tcp://", "ipc://")) for p in parts):
            raise ValueError(
                f"--engine-kv-events {text!r}: expected tcp://HOST:PORT[,tcp://HOST:PORT] "
                "(the engine's events endpoint, then its replay endpoint)"
            )
        return cls(parts[0], parts[1] if len(parts) == 2 else None)


class KVEventSubscriber:
    """Follows one engine's events into :attr:`index`. Runs on the event loop it was
    started on; ``close`` is idempotent."""

    def __init__(
        self, source: KVEventsEndpoint, name: str = "", *, replay_timeout_s: float = 1.0
    ) -> None:
        self.source = source
        self.name = name or source.endpoint
        self.replay_timeout_s = replay_timeout_s
        self.index = BlockIndex()
        self.live = False
        self.last_seq = -1  # the last batch applied
        self._live_seq: int | None = None  # the last seq the live socket brought
        self.num_batches = 0
        self.num_replayed = 0
        self.num_gaps = 0
        self.num_lost = 0  # gaps the replay could not fill (the index was cleared)
        self.num_restarts = 0
        self.num_bad = 0  # frames that were not a batch
        self._ctx = zmq.asyncio.Context()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Connect and follow the events in a task (mutates)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop following and close the sockets (mutates; idempotent)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._ctx.destroy(linger=0)

    def forget(self) -> None:
        """The engine is down (mutates): its cache may be gone; not live until a batch
        comes."""
        self.index.clear()
        self.live = False

    def stats(self) -> dict[str, int | bool]:
        """Counts for /metrics and tests (pure)."""
        return {
            "live": self.live,
            "blocks": len(self.index),
            "batches": self.num_batches,
            "gaps": self.num_gaps,
            "replayed": self.num_replayed,
            "lost": self.num_lost,
            "restarts": self.num_restarts,
        }

    # -- the stream ---------------------------------------------------------------------

    async def _run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        sub.connect(self.source.endpoint)
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    self.num_bad += 1
                    continue
                await self._on_batch(seq_of(frames[1]), frames[2])
        finally:
            sub.close(linger=0)

    async def _on_batch(self, seq: int, payload: bytes) -> None:
        """One batch from the live socket, by the sequence rules above (mutates)."""
        if self._live_seq is not None and seq <= self._live_seq:
            log.info("kv events of %s restarted at %d (was %d)", self.name, seq, self._live_seq)
            self.num_restarts += 1
            self.index.clear()
            self.last_seq = -1
        self._live_seq = seq
        if seq <= self.last_seq:
            return  # the replay brought it already
        if seq > self.last_seq + 1:
            self.num_gaps += 1
            await self._fill(self.last_seq + 1, seq)
        if seq > self.last_seq:
            self._apply(seq, payload)
        self.live = True

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except msgspec.DecodeError:
            self.num_bad += 1
            log.warning("kv events of %s: batch %d is not a KVEventBatch", self.name, seq)
        else:
            for event in batch.events:
                self.index.apply(event)
            self.num_batches += 1
        self.last_seq = seq

    async def _fill(self, start: int, end: int) -> None:
        """Apply batches ``start``..``end - 1`` from the replay socket (mutates); when it
        cannot give them all, clear the index first (removals may be among those lost)."""
        replayed = await self._replay(start) if self.source.replay_endpoint else []
        if not replayed or replayed[0][0] != start:
            log.warning(
                "kv events of %s: batches %d-%d lost; the index starts afresh",
                self.name,
                start,
                end - 1,
            )
            self.num_lost += 1
            self.index.clear()
        for seq, payload in replayed:
            if seq > self.last_seq:
                self._apply(seq, payload)
                self.num_replayed += 1

    async def _replay(self, start: int) -> list[tuple[int, bytes]]:
        """The replay socket's batches from ``start`` on, until its end marker, or what
        came before ``replay_timeout_s`` ran out (network)."""
        assert self.source.replay_endpoint is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.source.replay_endpoint)
        got: list[tuple[int, bytes]] = []
        try:
            await sock.send_multipart((b"", seq_bytes(start)))
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), self.replay_timeout_s)
                if len(frames) != 4:
                    continue
                seq = seq_of(frames[2])
                if seq == END_SEQ:
                    return got
                got.append((seq, frames[3]))
        except TimeoutError:
            timeout = self.replay_timeout_s
            log.warning("kv events of %s: no end of replay within %.1f s", self.name, timeout)
            return got
        finally:
            sock.close(linger=0)
