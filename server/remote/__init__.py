"""Remote engines: the graph scheduler in front of vLLM and SGLang fleets (docs/engines.md).

    config.py        RemoteConfig (the --engine-url / --routing flags)
    client.py        one engine's HTTP API (aiohttp): models, tokenize, streamed completions
    handshake.py     start-up checks: model, context window, same tokenizer, token-id
                     prompts, priority, structured-output dialect
    dialect.py       how vLLM, older vLLM and SGLang spell a structured-output constraint
    load.py          an engine's load from its /metrics
    prefix_index.py  which seam prefixes each engine has seen (the prediction)
    kv_index.py      which blocks an engine holds, from its own KV cache events
    kv_subscriber.py one engine's KV events followed live (ZMQ): gaps, replay, restarts
    routing.py       the routing policy, a pure function of the pool's state
    preemption.py    background work beside latency work: a cap per engine, preemption
    members.py       remote engines and the built-in one behind one attempt interface
    pool.py          health, re-probing, slots, pins and groups per engine
    backend.py       RemoteBackend: the scheduler's Backend, with failover by continuation

:func:`build_remote_backend` wires them; nothing here loads model weights unless the
built-in engine is a member.
"""

from __future__ import annotations

from collections.abc import Callable

from eclectus.server.backend import Backend
from eclectus.server.remote.backend import RemoteBackend
from eclectus.server.remote.config import RemoteConfig
from eclectus.server.remote.errors import RemoteStartError
from eclectus.server.remote.routing import RoutingPolicy


def build_remote_backend(
    config: RemoteConfig, builtin_factory: Callable[[], Backend] | None = None
) -> RemoteBackend:
    """The backend ``config`` describes (blocking: reads the tokenizer; the built-in engine's
    weights too when ``config.builtin``, through ``builtin_factory``). ValueError for a
    model directory without a tokenizer."""
    from eclectus.models.presets import resolve_model_dir
    from eclectus.models.tokenizer import Tokenizer
    from eclectus.server.remote.client import EngineClient
    from eclectus.server.remote.kv_subscriber import KVEventSubscriber
    from eclectus.server.remote.members import LocalMember, Member, RemoteMember
    from eclectus.server.remote.pool import EnginePool

    tokenizer = Tokenizer.from_dir(resolve_model_dir(config.model))
    members: list[Member] = []
    events: list[KVEventSubscriber | None] = []
    if config.builtin:
        assert builtin_factory is not None, "the built-in member needs a factory"
        members.append(LocalMember(builtin_factory()))
        events.append(None)  # in-process: the prediction is exact (it gets the pins)
    sources = config.kv_events or (None,) * len(config.engine_urls)
    for url, source in zip(config.engine_urls, sources, strict=True):
        events.append(None if source is None else KVEventSubscriber(source, url))
    for url in config.engine_urls:
        client = EngineClient(
            url,
            api_key=config.api_key,
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
        )
        members.append(RemoteMember(client, tokenizer))
    pool = EnginePool(
        members,
        policy=config.routing,
        params=config.routing_params,
        max_inflight_per_engine=config.max_inflight_per_engine,
        max_background_per_engine=config.max_background_per_engine,
        probe_interval_s=config.probe_interval_s,
        max_down_wait_s=config.max_down_wait_s,
        events=events,
    )
    return RemoteBackend(pool, tokenizer, window=config.max_model_len)


__all__ = [
    "RemoteBackend",
    "RemoteConfig",
    "RemoteStartError",
    "RoutingPolicy",
    "build_remote_backend",
]
