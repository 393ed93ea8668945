"""KV cache events: vLLM's recorded batches through a real ZeroMQ publisher into the index
(stored, removed, cleared, a gap filled by replay, a gap lost, a restarted publisher), and the
built-in engine's own events checked against its cache."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_helpers import ScriptedPublisher, recorded
from remote_helpers import EngineProcess, free_port

from eclectus.protocol import SamplingParams
from eclectus.protocol.kv_events import (
    AllBlocksCleared,
    KVEventBatch,
    KVEventsConfig,
    decode_batch,
    encode_batch,
)
from eclectus.server.config import ServerConfig
from eclectus.server.engine.block_manager import BlockManager
from eclectus.server.engine.sequence import Sequence
from eclectus.server.front.app import start_server
from eclectus.server.remote import RemoteConfig, build_remote_backend
from eclectus.server.remote.kv_index import BlockIndex, chain_keys
from eclectus.server.remote.kv_subscriber import KVEventsEndpoint, KVEventSubscriber

RECORD = recorded()
FRAMES: list[tuple[int, bytes]] = [(seq, payload) for seq, payload in RECORD["frames"]]
BLOCK_SIZE = RECORD["block_size"]
PROMPTS = RECORD["prompts"]  # batch 0 is prompt 0, batch k > 0 prompt k + 1 (1 hit only)


def held(index: BlockIndex, prompt: dict[str, object]) -> int:
    ids, salt = prompt["token_ids"], prompt["cache_salt"]
    assert isinstance(ids, list) and (salt is None or isinstance(salt, str))
    return index.match(chain_keys(ids, BLOCK_SIZE, salt))


def offline(frames: list[tuple[int, bytes]]) -> BlockIndex:
    """The index the given frames build, applied directly."""
    index = BlockIndex()
    for _, payload in frames:
        for event in decode_batch(payload).events:
            index.apply(event)
    return index


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


@pytest.fixture
async def wire() -> AsyncIterator[tuple[ScriptedPublisher, KVEventSubscriber]]:
    pub_port, replay_port = free_port(), free_port()
    publisher = ScriptedPublisher(pub_port, replay_port)
    source = KVEventsEndpoint(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")
    subscriber = KVEventSubscriber(source, "vllm")
    subscriber.start()
    await publisher.wait_subscriber()
    yield publisher, subscriber
    await subscriber.close()
    await publisher.close()


def test_recorded_vllm_events_build_what_vllm_cached() -> None:
    """vLLM's own frames: a shared prefix is held for both prompts, a salted prompt only
    under its salt, and evicted blocks are gone."""
    first_two = offline(FRAMES[:2])  # the shared prefix, then the salted prompt
    assert held(first_two, PROMPTS[0]) == held(first_two, PROMPTS[1]) == 3 * BLOCK_SIZE
    assert held(first_two, PROMPTS[2]) == 3 * BLOCK_SIZE
    unsalted = {**PROMPTS[2], "cache_salt": None}
    assert held(first_two, unsalted) == 3 * BLOCK_SIZE  # same ids as prompt 0's prefix
    other_salt = {**PROMPTS[2], "cache_salt": "tenant-b"}
    assert held(first_two, other_salt) == 0
    everything = offline(FRAMES)
    assert held(everything, PROMPTS[0]) == 0  # evicted by the later prompts (LRU)
    assert held(everything, PROMPTS[-1]) == 4 * BLOCK_SIZE
    assert len(everything) == 48 - 2  # vLLM's pool of 48 blocks, less its null block and one


async def test_subscriber_follows_a_publisher(
    wire: tuple[ScriptedPublisher, KVEventSubscriber],
) -> None:
    """Every recorded batch sent live: the subscriber's index is the offline one."""
    publisher, subscriber = wire
    assert not subscriber.live
    for seq, payload in FRAMES:
        await publisher.send(seq, payload)
    await until(lambda: subscriber.last_seq == FRAMES[-1][0])
    assert subscriber.live and subscriber.num_gaps == 0
    assert [held(subscriber.index, p) for p in PROMPTS] == [
        held(offline(FRAMES), p) for p in PROMPTS
    ]


async def test_all_blocks_cleared(wire: tuple[ScriptedPublisher, KVEventSubscriber]) -> None:
    """AllBlocksCleared empties the index; later batches fill it again."""
    publisher, subscriber = wire
    for seq, payload in FRAMES[:2]:
        await publisher.send(seq, payload)
    await until(lambda: len(subscriber.index) == 6)
    cleared = encode_batch(KVEventBatch(ts=0.0, events=[AllBlocksCleared()]))
    await publisher.send(2, cleared)
    await until(lambda: subscriber.last_seq == 2)
    assert len(subscriber.index) == 0 and held(subscriber.index, PROMPTS[0]) == 0
    await publisher.send(3, FRAMES[0][1])
    await until(lambda: held(subscriber.index, PROMPTS[0]) == 3 * BLOCK_SIZE)


async def test_gap_is_filled_from_the_replay_socket(
    wire: tuple[ScriptedPublisher, KVEventSubscriber],
) -> None:
    """Batches the live socket never delivered are asked for and applied in order."""
    publisher, subscriber = wire
    await publisher.send(0, FRAMES[0][1])
    for seq, payload in FRAMES[1:-1]:
        publisher.kept[seq] = payload  # in the publisher's buffer, never sent live
    await publisher.send(*FRAMES[-1])
    await until(lambda: subscriber.last_seq == FRAMES[-1][0])
    assert subscriber.num_gaps == 1 and subscriber.num_lost == 0
    # the replay gives all it keeps from 1 on, the live batch too (then not applied twice)
    assert subscriber.num_replayed == len(FRAMES) - 1
    assert [held(subscriber.index, p) for p in PROMPTS] == [
        held(offline(FRAMES), p) for p in PROMPTS
    ]


async def test_gap_the_replay_cannot_fill_clears_the_index(
    wire: tuple[ScriptedPublisher, KVEventSubscriber],
) -> None:
    """When the replay lacks the first missing batch (its buffer moved on), removals may
    be lost: the index starts afresh from what comes next."""
    publisher, subscriber = wire
    await publisher.send(0, FRAMES[0][1])
    await until(lambda: subscriber.last_seq == 0)
    assert held(subscriber.index, PROMPTS[0]) == 3 * BLOCK_SIZE
    # batches 1-2 are gone from the buffer; 3 is kept; 4 comes live
    publisher.kept = {3: FRAMES[3][1]}
    await publisher.send(4, FRAMES[4][1])
    await until(lambda: subscriber.last_seq == 4)
    assert subscriber.num_gaps == 1 and subscriber.num_lost == 1
    assert held(subscriber.index, PROMPTS[0]) == 0  # cleared: it may have been evicted
    assert held(subscriber.index, PROMPTS[4]) == 4 * BLOCK_SIZE  # batch 3: prompt 4


async def test_a_restarted_publisher_is_followed_afresh() -> None:
    """The engine restarts (a new publisher on the same endpoint, seq from 0 again): ZeroMQ
    reconnects, the subscriber drops what the old engine held and follows the new one."""
    pub_port, replay_port = free_port(), free_port()
    source = KVEventsEndpoint(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")
    subscriber = KVEventSubscriber(source, "vllm")
    subscriber.start()
    try:
        first = ScriptedPublisher(pub_port, replay_port)
        await first.wait_subscriber()
        for seq, payload in FRAMES[:3]:
            await first.send(seq, payload)
        await until(lambda: subscriber.last_seq == 2)
        assert held(subscriber.index, PROMPTS[0]) == 3 * BLOCK_SIZE
        await first.close()
        second = ScriptedPublisher(pub_port, replay_port)
        await second.wait_subscriber()  # the subscriber reconnected by itself
        await second.send(0, FRAMES[3][1])
        await until(lambda: subscriber.num_restarts == 1 and subscriber.last_seq == 0)
        assert held(subscriber.index, PROMPTS[0]) == 0
        assert held(subscriber.index, PROMPTS[4]) == 4 * BLOCK_SIZE  # batch 3: prompt 4
        await second.close()
    finally:
        await subscriber.close()


def test_forget_makes_the_stream_not_live() -> None:
    """The pool marks an engine down: its index goes, and it is routed by prediction
    until a batch arrives."""
    subscriber = KVEventSubscriber(KVEventsEndpoint("tcp://127.0.0.1:1"))
    subscriber.live = True
    for event in decode_batch(FRAMES[0][1]).events:
        subscriber.index.apply(event)
    subscriber.forget()
    assert not subscriber.live and len(subscriber.index) == 0


def test_kv_events_flags_are_checked() -> None:
    """A wrong flag is one clear error naming it."""
    with pytest.raises(ValueError, match="unknown keys"):
        KVEventsConfig.from_json('{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}')
    with pytest.raises(ValueError, match="not JSON"):
        KVEventsConfig.from_json("{enable}")
    with pytest.raises(ValueError, match="--engine-kv-events"):
        KVEventsEndpoint.parse("http://gpu0:5557")
    assert KVEventsEndpoint.parse("tcp://h:1,tcp://h:2") == KVEventsEndpoint(
        "tcp://h:1", "tcp://h:2"
    )


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([None, "tenant-a"]))
def test_builtin_engine_events_index_what_its_cache_holds(seed: int, tenant: str | None) -> None:
    """The block manager's events, folded into an index, say exactly which full blocks of
    any prompt its cache holds, through allocations, frees and LRU evictions."""
    rng = random.Random(seed)
    bs = 4
    manager = BlockManager(12, bs, enable_kv_events=True)
    index = BlockIndex()
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 14))] for _ in range(3)]
    live: list[Sequence] = []
    prompts: list[list[int]] = []
    for step in range(12):
        ids = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
        prompts.append(ids)
        seq = Sequence(f"r{step}", ids, SamplingParams(), step, tenant=tenant)
        hits = manager.find_cached_blocks(seq)
        if manager.allocate_slots(seq, seq.num_tokens - len(hits) * bs, hits):
            seq.num_computed_tokens = seq.num_tokens
            live.append(seq)
        while live and (rng.random() < 0.5 or manager.num_free_blocks < 4):
            manager.free(live.pop(rng.randrange(len(live))))
        for event in manager.take_events():
            index.apply(event)
        for prompt in prompts:  # one more token: every full block of the prompt counts
            probe = Sequence("probe", [*prompt, 0], SamplingParams(), 0, tenant=tenant)
            cached = len(manager.find_cached_blocks(probe)) * bs
            assert index.match(chain_keys(prompt, bs, tenant)) == cached


def events_flag(pub_port: int, replay_port: int) -> tuple[str, ...]:
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub_port}",  # vLLM binds a wildcard endpoint, else connects
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
    }
    return ("--kv-events-config", json.dumps(config))


@pytest.mark.slow
async def test_front_routes_by_the_cache_the_engines_report() -> None:
    """Two real engine processes publish their KV events; another client prefills a
    document on the second one directly, and the front, which never saw that request,
    sends a question on the same document there (by prefix) rather than to the idle
    first engine that least-loaded picks."""
    ports = [(free_port(), free_port()) for _ in range(2)]
    engines = [EngineProcess(free_port(), extra_args=events_flag(*p)).start() for p in ports]
    try:
        for engine in engines:
            engine.wait_ready()
        sources = tuple(
            KVEventsEndpoint(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")
            for pub, replay in ports
        )
        config = RemoteConfig(
            model="tiny", engine_urls=tuple(e.url for e in engines), kv_events=sources
        )
        backend = build_remote_backend(config)
        async with await start_server(ServerConfig(port=0), backend, owns_backend=True) as server:
            pool = backend.pool
            document = " ".join(f"The harbor log entry {i} says the ferry ran." for i in range(24))
            async with httpx.AsyncClient(timeout=60) as client:
                other = {"model": "tiny", "prompt": document + " Q: when?", "max_tokens": 2}
                (await client.post(f"{engines[1].url}/completions", json=other)).raise_for_status()
                subscriber = pool.engines[1].events
                assert subscriber is not None
                await until(lambda: subscriber.live and len(subscriber.index) > 8, timeout=20)
                ours = {"model": "tiny", "prompt": document + " Q: who?", "max_tokens": 2}
                reply = await client.post(f"{server.openai_url}/completions", json=ours)
                reply.raise_for_status()
            assert pool.decisions == {"prefix": 1}
            assert [e.num_requests for e in pool.engines] == [0, 1]
            stats = backend.stats().extra
            assert stats["engine1_kv_events_live"] == 1.0 and stats["engine1_kv_events_lost"] == 0
    finally:
        for engine in engines:
            engine.stop()


def test_pool_reads_events_when_live_and_predicts_otherwise() -> None:
    """An engine whose events are live is matched by its index plus our requests in flight
    there; before its first batch (or once forgotten), by the prediction."""
    from typing import cast

    from eclectus.server.front.prompt import Prompt
    from eclectus.server.remote.members import Member
    from eclectus.server.remote.pool import PoolEngine, _Chains
    from eclectus.server.remote.prefix_index import prefix_keys

    ids = tuple(PROMPTS[0]["token_ids"])
    prompt = Prompt(ids, (97, len(ids)))
    keys = prefix_keys(prompt, None)
    engine = PoolEngine(0, cast(Member, None), 8)
    engine.events = KVEventSubscriber(KVEventsEndpoint("tcp://127.0.0.1:1"))
    engine.prefixes.insert(keys)  # this front once placed the whole prompt here
    assert engine.match(keys, _Chains(ids, None)) == len(ids)  # not live: the prediction
    engine.events.live = True  # live, and the engine reported nothing: it holds nothing
    assert engine.match(keys, _Chains(ids, None)) == 0
    for event in decode_batch(FRAMES[0][1]).events:
        engine.events.index.apply(event)
    assert engine.match(keys, _Chains(ids, None)) == 3 * BLOCK_SIZE  # what it reported
    engine.placed["r1"] = keys  # in flight here now: it is computing all of it
    assert engine.match(keys, _Chains(ids, None)) == len(ids)
    engine.events.forget()
    del engine.placed["r1"]
    assert engine.match(keys, _Chains(ids, None)) == len(ids)  # back to the prediction
