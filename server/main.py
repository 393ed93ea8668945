"""``eclectus serve`` (also ``python -m eclectus.server``): run the server until interrupted.

The flags are the server's limits (:class:`ServerConfig`) and the built-in engine's budgets
(:class:`EngineConfig`), the latter under vLLM's names where vLLM has one (``--block-size``,
``--max-num-batched-tokens``, ``--max-num-seqs``, ``--max-model-len``, ``--dtype``,
``--enable-prefix-caching``, ``--seed``). :func:`run` is also how the evals start their server
(:mod:`eclectus.evals.serve` wraps the engine in a tracer and changes nothing else).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import TypeVar, get_args

from eclectus.protocol.tool_formats import TOOL_FORMATS
from eclectus.server.backend import Backend
from eclectus.server.checks import in_range
from eclectus.server.config import Admission, ServerConfig, read_token_file
from eclectus.server.engine.engine_config import (
    JSON_WHITESPACE,
    SUPPORTED_DTYPES,
    EngineConfig,
    GiB,
)
from eclectus.server.graph.policies import ProgramPolicy


T = TypeVar("T", int, float)


def _parsed(text: str, parse: Callable[[str], T], fits: Callable[[T], bool], what: str) -> T:
    """``parse(text)`` when it parses and fits, else argparse's error saying it ``must be
    {what}`` (argparse names the flag). The one shape of every number flag's type."""
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not fits(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _parsed(text, int, lambda value: value >= 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _parsed(text, int, lambda value: value >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (seconds, rates, fractions)."""
    return _parsed(text, float, lambda v: in_range(v, 0, inclusive=False), "a number > 0")


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0 (a grace period that may be none, a rate)."""
    return _parsed(text, float, lambda v: in_range(v, 0, inclusive=True), "a number >= 0")


def positive_gib(text: str) -> float:
    """An argparse type: a finite number of GiB > 0 that is at least one byte."""

    def fits(value: float) -> bool:
        return in_range(value, 0, inclusive=False) and round(value * GiB) >= 1

    return _parsed(text, float, fits, "a number of GiB > 0")


def positive_int_or_none(text: str) -> int | None:
    """An argparse type: an integer >= 1, or "none" (no limit)."""
    return None if text.strip().lower() == "none" else positive_int(text)


def non_negative_int_or_none(text: str) -> int | None:
    """An argparse type: an integer >= 0, or "none" (no limit)."""
    return None if text.strip().lower() == "none" else non_negative_int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The serve flags (mutates ``parser``)."""
    defaults = ServerConfig()
    parser.add_argument("--host", default=defaults.host, help="address to bind")
    parser.add_argument("--port", type=int, default=defaults.port, help="port (0: any free)")
    parser.add_argument(
        "--model",
        default=defaults.model,
        help="'tiny' or a local Hugging Face checkpoint directory",
    )
    parser.add_argument(
        "--served-model-name",
        dest="served_model_names",
        nargs="+",
        default=[],
        metavar="NAME",
        help="the model names clients may use (default: the --model value, as vLLM does)",
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=TOOL_FORMATS,
        default=defaults.tool_call_parser,
        help="the model's tool-call syntax (default: detected from its chat template)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="require this token (tenant 'default'; default: $ECLECTUS_TOKEN; unset: off)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="one 'TENANT TOKEN' pair per line; a client's tenant is its token's",
    )
    parser.add_argument(
        "--max-frame-bytes",
        type=int,
        default=defaults.max_frame_bytes,
        help="largest client frame; a larger one gets a limit_exceeded error",
    )
    parser.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=defaults.max_prompt_tokens,
        help="longest prompt of one call, variables filled in",
    )
    parser.add_argument(
        "--max-vars-per-session",
        type=int,
        default=defaults.max_vars_per_session,
        help="semantic variables one session may declare",
    )
    parser.add_argument(
        "--max-calls-per-session",
        type=int,
        default=defaults.max_calls_per_session,
        help="calls and server-side ops one session may declare",
    )
    parser.add_argument(
        "--max-map-items",
        type=positive_int,
        default=defaults.max_map_items,
        help="elements one map op may fan out to",
    )
    parser.add_argument(
        "--max-map-element-bytes",
        type=positive_int,
        default=defaults.max_map_element_bytes,
        help="bytes of one map element",
    )
    parser.add_argument(
        "--max-pending-gets-per-session",
        type=positive_int,
        default=defaults.max_pending_gets_per_session,
        help="gets one session may have waiting on unfinished variables",
    )
    parser.add_argument(
        "--max-outbox-bytes",
        type=positive_int,
        default=defaults.max_outbox_bytes,
        help="frames queued for one slow reader before its session is closed",
    )
    parser.add_argument(
        "--max-sessions", type=int, default=defaults.max_sessions, help="open sessions at once"
    )
    parser.add_argument(
        "--max-sessions-per-tenant",
        type=int,
        default=defaults.max_sessions_per_tenant,
        help="open sessions one tenant may hold",
    )
    parser.add_argument(
        "--max-connections",
        type=positive_int,
        default=defaults.max_connections,
        help="open TCP connections, all clients together (beyond: HTTP 429, retried by the SDK)",
    )
    parser.add_argument(
        "--max-connections-per-client",
        type=positive_int_or_none,
        default=defaults.max_connections_per_client,
        metavar="N|none",
        help="open TCP connections one client address may hold (default none: a front behind "
        "a load balancer or serving one app server sees one address)",
    )
    parser.add_argument(
        "--max-prompts-per-request",
        type=int,
        default=defaults.max_prompts_per_request,
        help="prompts in one /v1/completions request",
    )
    parser.add_argument(
        "--handshake-timeout",
        dest="handshake_timeout_s",
        type=positive_float,
        default=defaults.handshake_timeout_s,
        help="seconds for an HTTP request head, or for hello after the upgrade",
    )
    parser.add_argument(
        "--idle-timeout",
        dest="idle_timeout_s",
        type=positive_float,
        default=defaults.idle_timeout_s,
        help="seconds before a session with nothing in flight is closed",
    )
    parser.add_argument(
        "--shutdown-timeout",
        dest="shutdown_timeout_s",
        type=non_negative_float,
        default=defaults.shutdown_timeout_s,
        help="seconds in-flight work may take to finish after SIGTERM",
    )
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=defaults.max_inflight,
        help="engine requests in flight at once, all sessions together",
    )
    parser.add_argument(
        "--max-inflight-per-tenant",
        type=positive_int_or_none,
        default=defaults.max_inflight_per_tenant,
        metavar="N|none",
        help="a tenant's fair share of --max-inflight while another tenant's calls wait "
        "(work-conserving: unused slots still go to anyone); none (default): app-FIFO only",
    )
    parser.add_argument(
        "--max-background-inflight",
        type=int,
        default=defaults.max_background_inflight,
        help="throughput requests in flight while latency work is in flight",
    )
    parser.add_argument(
        "--aging-rate",
        type=non_negative_float,
        default=defaults.aging_rate,
        help="app-FIFO aging: seconds of rank credit per second waited",
    )
    parser.add_argument(
        "--program-policy",
        choices=[p.value for p in ProgramPolicy],
        default=defaults.program_policy,
        help="the order of programs within a class: fifo (app-FIFO with aging), las (least "
        "attained service: Autellix's PLAS/ATLAS, in tokens computed), deadline (earliest "
        "deadline first; docs/architecture.md)",
    )
    parser.add_argument(
        "--las-tokens-per-s",
        type=positive_float,
        default=defaults.las_tokens_per_s,
        help="las: tokens of attained service that rank like one second of arrival",
    )
    parser.add_argument(
        "--latency-deadline",
        dest="latency_deadline_s",
        type=positive_float,
        default=defaults.latency_deadline_s,
        help="deadline policy: seconds after its graph's arrival a latency get is due",
    )
    parser.add_argument(
        "--admission",
        choices=get_args(Admission),
        default=defaults.admission,
        help="engine: requests go to the engine only while its batch and KV cache have room, "
        "the rest wait in the scheduler's order; off: up to --max-inflight go",
    )
    parser.add_argument(
        "--max-engine-seqs",
        type=positive_int_or_none,
        default=defaults.max_engine_seqs,
        metavar="N|none",
        help="requests admitted to one engine at once; none (default): the engine's own "
        "batch (--max-num-seqs; remote: --engine-max-inflight)",
    )
    parser.add_argument(
        "--kv-admit-fraction",
        type=positive_float,
        default=defaults.kv_admit_fraction,
        help="KV cache the admitted requests may reserve (prompt + max_tokens each)",
    )
    parser.add_argument(
        "--openai-port",
        type=int,
        default=None,
        help="deprecated and ignored: /v1 is served on --port",
    )
    parser.add_argument(
        "--api-server-count",
        type=positive_int,
        default=1,
        metavar="N",
        help="front processes serving the one port (vLLM's flag); N > 1 needs --engine-url "
        "and no --engine builtin (docs/engines.md, 'Several front processes')",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        type=str.upper,
        help="server log verbosity (stderr)",
    )
    add_remote_arguments(parser)
    add_engine_arguments(parser)


def add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that put engines other processes serve behind the scheduler (vLLM, SGLang,
    another Eclectus; docs/engines.md) (mutates ``parser``)."""
    from eclectus.server.remote.config import RemoteConfig
    from eclectus.server.remote.routing import RoutingPolicy

    defaults = {f.name: f.default for f in fields(RemoteConfig)}
    remote = parser.add_argument_group("remote engines (docs/engines.md)")
    remote.add_argument(
        "--engine-url",
        dest="engine_urls",
        action="append",
        default=[],
        metavar="URL",
        help="an OpenAI-compatible engine to schedule for (vLLM, SGLang: http://host:port/v1); "
        "repeat for a fleet. --model then only gives the tokenizer and chat template",
    )
    remote.add_argument(
        "--engine",
        choices=["builtin"],
        default=None,
        help="with --engine-url: also run the built-in engine as one member of the pool "
        "(without --engine-url the built-in engine always serves)",
    )
    remote.add_argument(
        "--engine-kv-events",
        dest="engine_kv_events",
        action="append",
        default=[],
        metavar="PUB[,REPLAY]|none",
        help="where the engine of the --engine-url in the same position publishes its KV "
        "cache events (vLLM --kv-events-config; e.g. tcp://gpu0:5557,tcp://gpu0:5558): "
        "routing then reads what its cache holds; 'none' for an engine without",
    )
    remote.add_argument(
        "--routing",
        choices=[p.value for p in RoutingPolicy],
        default=defaults["routing"].value,
        help="how calls are spread over the engines (graph: prefix- and group-aware)",
    )
    remote.add_argument(
        "--engine-max-inflight",
        type=positive_int,
        default=defaults["max_inflight_per_engine"],
        help="our requests on one engine at once",
    )
    remote.add_argument(
        "--engine-max-background",
        type=non_negative_int_or_none,
        default=defaults["max_background_per_engine"],
        help="background (throughput) calls one engine runs while latency calls are in "
        "flight on it; the others are paused and continued later (none: no cap)",
    )
    remote.add_argument(
        "--engine-stream-interval",
        type=positive_int,
        default=ServerConfig().engine_stream_interval,
        help="tokens an engine may batch into one streamed output of a call nobody watches "
        "token by token (vLLM's stream_interval); 1: every token, as watched calls get",
    )
    remote.add_argument(
        "--engine-api-key",
        default=None,
        help="bearer token for the engines (vLLM --api-key; default: $ECLECTUS_ENGINE_API_KEY)",
    )
    remote.add_argument(
        "--engine-timeout",
        type=positive_float,
        default=defaults["read_timeout_s"],
        help="seconds to wait for an engine's next streamed piece before failing over",
    )
    remote.add_argument(
        "--engine-probe-interval",
        type=positive_float,
        default=defaults["probe_interval_s"],
        help="seconds between re-probes of a down engine (and /metrics scrapes)",
    )


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The built-in engine's flags, one per EngineConfig field but ``model`` (shared with the
    server) and ``kv_cache_bytes`` (given in GiB) (mutates ``parser``)."""
    defaults = EngineConfig()
    engine = parser.add_argument_group("engine budgets (the built-in engine's EngineConfig)")
    engine.add_argument(
        "--dtype",
        choices=SUPPORTED_DTYPES,
        default=defaults.dtype,
        help="model and KV cache dtype",
    )
    engine.add_argument("--device", default=defaults.device, help="torch device (cpu, cuda, ...)")
    engine.add_argument(
        "--block-size", type=positive_int, default=defaults.block_size, help="tokens per KV block"
    )
    engine.add_argument(
        "--kv-cache-gib",
        type=positive_gib,
        default=defaults.kv_cache_bytes / GiB,
        help="KV pool, all layers, K and V, in GiB (vLLM on CPU: VLLM_CPU_KVCACHE_SPACE)",
    )
    engine.add_argument(
        "--num-kv-blocks",
        type=positive_int,
        default=None,
        help="exact KV pool size in blocks; overrides --kv-cache-gib "
        "(vLLM: --num-gpu-blocks-override)",
    )
    engine.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=defaults.max_num_batched_tokens,
        help="tokens per engine step, prefill chunks and decodes together",
    )
    engine.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=defaults.max_num_seqs,
        help="most requests in one engine step",
    )
    engine.add_argument(
        "--max-background-seqs",
        type=positive_int_or_none,
        default=defaults.max_background_seqs,
        help="most throughput requests in one step while a latency-critical request is in "
        "the engine ('none': no limit)",
    )
    engine.add_argument(
        "--max-model-len",
        type=positive_int,
        default=defaults.max_model_len,
        help="context window cap (default: the model's own)",
    )
    engine.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=defaults.enable_prefix_caching,
        help="reuse the KV of full blocks a prompt shares with an earlier one",
    )
    engine.add_argument(
        "--cascade-attention",
        action=argparse.BooleanOptionalAction,
        default=defaults.cascade_attention,
        help="shared-prefix decode attention when it pays",
    )
    engine.add_argument(
        "--jump-forward",
        action=argparse.BooleanOptionalAction,
        default=defaults.jump_forward,
        help="structured outputs: append a grammar's forced continuation without sampling "
        "(fewer steps; changes greedy outputs: they are no longer stock vLLM's)",
    )
    engine.add_argument(
        "--budget-guarantee",
        action=argparse.BooleanOptionalAction,
        default=defaults.budget_guarantee,
        help="structured outputs: close the structure within max_tokens (changes replies "
        "near max_tokens: they are no longer stock vLLM's)",
    )
    engine.add_argument(
        "--json-whitespace",
        choices=JSON_WHITESPACE,
        default=defaults.json_whitespace,
        help="structured outputs: whitespace between JSON tokens: 'bounded' (what JSON "
        "printers write, at most one line break per place), 'any' (stock vLLM's default) or "
        "'compact' (separators only)",
    )
    engine.add_argument(
        "--compact-json",
        action="store_const",
        const="compact",
        dest="json_whitespace",
        help="--json-whitespace compact: no free whitespace between JSON tokens, for every "
        "request (vLLM's --structured-outputs-config disable_any_whitespace)",
    )
    engine.add_argument(
        "--num-threads",
        type=positive_int,
        default=defaults.num_threads,
        help="torch CPU threads (default: all cores but one)",
    )
    engine.add_argument(
        "--seed",
        type=non_negative_int,
        default=defaults.seed,
        help="the generator of unseeded sampled requests",
    )
    engine.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help="publish the prefix cache's changes as vLLM's KV events, with vLLM's flag and "
        'JSON (e.g. \'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558"}\'), for a front routing by them',
    )
    engine.add_argument(
        "--engine-process",
        choices=("on", "off"),
        default="on",
        help="on: step the engine in its own process (vLLM's EngineCore split; the torch "
        "threads are that process's); off: on a thread of the server's process",
    )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig the flags describe: each flag whose dest names a field (pure apart
    from reading ECLECTUS_TOKEN)."""
    given = {f.name: getattr(args, f.name) for f in fields(ServerConfig) if hasattr(args, f.name)}
    given["token"] = args.token or ServerConfig.token_from_env()
    given["served_model_names"] = tuple(args.served_model_names)
    token_file = getattr(args, "token_file", None)
    if token_file is not None:
        given["tenant_tokens"] = read_token_file(token_file)
    return ServerConfig(**given)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the flags describe: each flag whose dest names a field, and
    ``--kv-cache-gib`` as ``kv_cache_bytes`` (pure; ValueError from EngineConfig's checks)."""
    given = {f.name: getattr(args, f.name) for f in fields(EngineConfig) if hasattr(args, f.name)}
    given["kv_cache_bytes"] = round(args.kv_cache_gib * GiB)
    text = getattr(args, "kv_events_config", None)
    if text is not None:
        from eclectus.protocol.kv_events import KVEventsConfig

        given["kv_events"] = KVEventsConfig.from_json(text)
    return EngineConfig(**given)


def load_engine(
    engine_config: EngineConfig,
    wrap: Callable[[Backend], Backend] | None = None,
    *,
    process: bool = False,
) -> Backend:
    """Load the built-in engine (blocking: reads the weights), wrapped by ``wrap`` when given
    (the evals wrap it in a tracer); ``process``: its core in its own process
    (:class:`ProcessEngine`), else on a thread here. ValueError for a model that cannot be
    found."""
    from eclectus.server.engine import AsyncEngine, ProcessEngine

    engine = ProcessEngine(engine_config) if process else AsyncEngine.from_config(engine_config)
    return engine if wrap is None else wrap(engine)


def load_remote(args: argparse.Namespace, wrap: Callable[[Backend], Backend] | None) -> Backend:
    """The remote pool the flags describe (blocking: reads the tokenizer, and the built-in
    engine's weights with ``--engine builtin``), wrapped by ``wrap``. ValueError for bad
    flags or a model directory without a tokenizer."""
    import os

    from eclectus.server.remote import RemoteConfig, RoutingPolicy, build_remote_backend
    from eclectus.server.remote.kv_subscriber import KVEventsEndpoint

    kv_events = tuple(
        None if text.strip().lower() == "none" else KVEventsEndpoint.parse(text)
        for text in getattr(args, "engine_kv_events", [])
    )
    config = RemoteConfig(
        model=args.model,
        engine_urls=tuple(args.engine_urls),
        builtin=args.engine == "builtin",
        routing=RoutingPolicy(args.routing),
        # the scheduler admits at most --max-engine-seqs per engine: the pool's cap follows
        max_inflight_per_engine=min(
            args.engine_max_inflight, args.max_engine_seqs or args.engine_max_inflight
        ),
        max_background_per_engine=args.engine_max_background,
        api_key=args.engine_api_key or os.environ.get("ECLECTUS_ENGINE_API_KEY"),
        read_timeout_s=args.engine_timeout,
        probe_interval_s=args.engine_probe_interval,
        max_model_len=args.max_model_len,
        kv_events=kv_events,
    )
    engine_config = engine_config_from_args(args) if config.builtin else None
    process = getattr(args, "engine_process", "on") == "on"
    backend = build_remote_backend(
        config,
        lambda: load_engine(engine_config, process=process) if engine_config is not None else None,
    )
    return backend if wrap is None else wrap(backend)


async def serve_forever(
    config: ServerConfig,
    backend: Backend,
    *,
    listener: socket.socket | None = None,
    worker: int | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Serve ``backend`` until SIGINT/SIGTERM, then drain: stop accepting, let in-flight work
    finish within ``config.shutdown_timeout_s`` (a second signal cuts it short), fail the
    rest with a clear error. The server owns the backend and shuts it down. A front worker
    (workers.py) serves the parent's ``listener`` and calls ``on_ready`` once it serves, in
    place of the start-up line."""
    from eclectus.server.front.app import start_server

    server = await start_server(
        config, backend, owns_backend=True, listener=listener, worker=worker
    )
    stop, force = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (force if stop.is_set() else stop).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on every platform
            loop.add_signal_handler(sig, on_signal)
    if on_ready is not None:
        on_ready()
    else:
        print(serving_line(config.model, server.url), file=sys.stderr, flush=True)
    try:
        await stop.wait()
        if worker is None:
            print("eclectus: draining (a second signal stops now)", file=sys.stderr, flush=True)
    finally:
        await server.drain(config.shutdown_timeout_s, force)


def serving_line(model: str, url: str) -> str:
    """The start-up line (pure): scripts and tests read the URLs from it."""
    http = url.replace("ws://", "http://", 1)
    return (
        f"eclectus serving {model} on {url} (http: {http}/healthz, /metrics; OpenAI API: {http}/v1)"
    )


def run(args: argparse.Namespace, wrap: Callable[[Backend], Backend] | None = None) -> int:
    """Serve as the flags say until interrupted; 0 on a clean stop, 2 on bad flags or a model
    that cannot be loaded. ``wrap`` wraps the engine (see :func:`load_engine`)."""
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if getattr(args, "openai_port", None) is not None:
        print(
            "eclectus serve: --openai-port is deprecated and ignored; the OpenAI API is served "
            "on --port under /v1",
            file=sys.stderr,
        )
    from eclectus.server.remote.errors import RemoteStartError

    if getattr(args, "api_server_count", 1) > 1:
        from eclectus.server.front.workers import run_workers

        return run_workers(args, wrap)
    try:
        config = config_from_args(args)
        if args.engine_urls:
            backend = load_remote(args, wrap)
        else:
            process = getattr(args, "engine_process", "on") == "on"
            backend = load_engine(engine_config_from_args(args), wrap, process=process)
    except ValueError as exc:
        print(f"eclectus serve: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve_forever(config, backend))
    except RemoteStartError as exc:  # an engine is unreachable or has another tokenizer
        print(f"eclectus serve: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m eclectus.server``: the flags of ``eclectus serve``, the same errors."""
    from eclectus.cli import HelpFormatter, add_debug_flag
    from eclectus.cli_errors import run_guarded

    parser = argparse.ArgumentParser(
        prog="python -m eclectus.server",
        description="start the Eclectus server (the same as `eclectus serve`)",
        formatter_class=HelpFormatter,
    )
    add_debug_flag(parser)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_guarded("eclectus serve", run, args, debug=args.debug)
