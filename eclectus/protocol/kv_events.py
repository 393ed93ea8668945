"""KV cache events on the wire, as vLLM publishes them (``--kv-events-config``).

An engine with prefix caching publishes what its cache gains and loses: ``BlockStored``
(full blocks: their hashes, the parent's hash, their token ids, the block size),
``BlockRemoved`` (hashes evicted) and ``AllBlocksCleared`` (the cache was reset), in
batches, one per engine step. The transport is ZeroMQ: a PUB socket sends each batch as
three frames ``(topic, seq, payload)`` (``seq`` an 8-byte big-endian counter from 0,
``payload`` the msgpack of a :class:`KVEventBatch`), and an optional ROUTER socket replays
buffered batches to a subscriber that missed some: it takes the first wanted ``seq`` (8
bytes, big-endian) and answers every buffered batch from there, then an end marker whose
``seq`` is -1 and whose payload is empty.

The classes below match vLLM 0.32's ``vllm/distributed/kv_events.py`` field for field
(msgspec ``Struct``\\ s: a batch is an array, an event a map tagged with its class name in
``type``), so the built-in engine publishes what vLLM publishes and the front decodes both.
Fields a later vLLM adds are ignored on decode. This module is the contract the engine
(kv_publisher.py) and the remote pool (remote/kv_subscriber.py) share, so it lives in the
neutral contract package (the engine imports nothing of the server above it). It needs
msgspec, a server dependency: ``eclectus.protocol`` itself does not import it, so a
client-only install never loads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

import msgspec

ExternalBlockHash = bytes | int  # vLLM: sha256 bytes, or their low 64 bits as an int
END_SEQ = -1  # the replay's end marker
MEDIUM_GPU = "GPU"  # the engine's own KV pool (offloading tiers publish other media)


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """One change to an engine's prefix cache."""


class BlockStored(KVCacheEvent):
    """Full blocks that became cached, in prompt order: ``block_hashes[i]`` holds
    ``token_ids[i * block_size:(i + 1) * block_size]``; the first one's parent is
    ``parent_block_hash`` (None: it starts a prompt). ``extra_keys[i]`` holds what else
    entered block i's hash: for a prompt's first block, the request's ``cache_salt``."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks evicted from the cache."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The whole cache was dropped (vLLM's reset_prefix_cache)."""


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    """One step's events, in order; ``ts`` the publisher's wall clock."""

    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The batch's payload frame (pure)."""
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """A payload frame's batch (pure). msgspec.DecodeError when it is not one."""
    return _decoder.decode(payload)


def seq_bytes(seq: int) -> bytes:
    """A sequence number's frame: 8 bytes, big-endian, signed (the end marker is -1)."""
    return seq.to_bytes(8, "big", signed=True)


def seq_of(frame: bytes) -> int:
    """The sequence number in a frame (pure)."""
    return int.from_bytes(frame, "big", signed=True)


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """vLLM's ``--kv-events-config`` (a JSON object with these keys; the built-in engine's
    flag of the same name takes the same). ``endpoint``: where the PUB socket binds
    (``tcp://*:5557``) or connects; ``replay_endpoint``: the ROUTER for missed batches;
    ``buffer_steps``: batches kept for replay."""

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher not in ("zmq", "null"):
            raise ValueError(
                f"--kv-events-config publisher must be 'zmq' or 'null', not {self.publisher!r}"
            )
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"kv-events-config {name} must be >= 1")

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        """Parse the flag's JSON (pure). ValueError naming an unknown key or bad JSON."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-events-config is not JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"--kv-events-config: unknown keys {unknown}")
        return cls(**values)
