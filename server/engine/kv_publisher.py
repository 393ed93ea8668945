"""The built-in engine's KV cache events, published as vLLM publishes them.

With ``--kv-events-config '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557",
"replay_endpoint": "tcp://*:5558"}'`` the engine sends one :class:`KVEventBatch` per step that
changed its prefix cache (protocol/kv_events.py has the wire format), so a front routes by what
this engine really holds, exactly as it does for a vLLM started with the same flag.

ZeroMQ sockets are not thread-safe, so one thread owns both: the step loop hands batches over
a queue (``publish`` never blocks the step), the thread numbers them, sends them on the PUB
socket, keeps the last ``buffer_steps`` for replay and answers replay requests on the ROUTER
socket between batches, as vLLM's ``ZmqEventPublisher`` does.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque

import zmq

from eclectus.protocol.kv_events import (
    END_SEQ,
    KVEventBatch,
    KVEventsConfig,
    encode_batch,
    seq_bytes,
    seq_of,
)

log = logging.getLogger(__name__)
_POLL_S = 0.05  # how often the thread looks for replay requests while no batch comes


def _is_bind(endpoint: str) -> bool:
    """vLLM's rule: wildcard and ipc/inproc endpoints bind, the rest connect (pure)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KVEventPublisher:
    """PUB + optional ROUTER replay, on a thread of its own. ``publish`` and ``close`` may
    be called from any one thread; ``close`` is idempotent."""

    def __init__(self, config: KVEventsConfig) -> None:
        self.config = config
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(config.max_queue_size)
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        if _is_bind(config.endpoint):
            self._pub.bind(config.endpoint)
        else:
            self._pub.connect(config.endpoint)
        self._replay: zmq.Socket[bytes] | None = None
        if config.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(config.replay_endpoint)
        self._topic = config.topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="eclectus-kv-events", daemon=True)
        self._thread.start()

    def publish(self, batch: KVEventBatch) -> None:
        """Queue ``batch`` for sending (mutates; drops it with a warning when the queue is
        full: a subscriber then sees a gap and asks for a replay)."""
        if self._closed:
            return
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            log.warning("kv events: queue full, a batch was dropped")

    def close(self) -> None:
        """Send what is queued, stop the thread, close the sockets (mutates; idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=5)
        self._ctx.destroy(linger=0)

    def _run(self) -> None:
        seq = 0
        while True:
            self._serve_replays()
            try:
                batch = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if batch is None:
                return
            payload = encode_batch(batch)
            self._pub.send_multipart((self._topic, seq_bytes(seq), payload))
            self._buffer.append((seq, payload))
            seq += 1

    def _serve_replays(self) -> None:
        """Answer each waiting replay request: every buffered batch from its ``seq`` on,
        then the end marker (mutates the socket)."""
        replay = self._replay
        while replay is not None and replay.poll(0):
            frames = replay.recv_multipart()
            if len(frames) != 3:
                log.warning("kv events: a replay request of %d frames ignored", len(frames))
                continue
            client, empty, start = frames
            first = seq_of(start)
            for seq, payload in self._buffer:
                if seq >= first:
                    replay.send_multipart((client, empty, self._topic, seq_bytes(seq), payload))
            replay.send_multipart((client, empty, b"", seq_bytes(END_SEQ), b""))
