"""``eclectus serve`` (also ``python -m eclectus.server``): build the server its flags
describe (:mod:`.flags`, :mod:`.engine_flags`) and run it until interrupted. :func:`run` is
also how the evals start their server (:mod:`eclectus.evals.serve` wraps the engine in a
tracer and changes nothing else).
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

from eclectus.server import event_loop
from eclectus.server.backend import Backend
from eclectus.server.config import ServerConfig
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine_flags import engine_config_from_args

# add_arguments and run: the pair eclectus/cli.py asks a subcommand's module for
from eclectus.server.flags import add_arguments, config_from_args


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
        max_inflight_per_engine=(
            min(args.engine_max_inflight, args.max_engine_seqs)
            if isinstance(args.max_engine_seqs, int)
            else args.engine_max_inflight
        ),
        max_background_per_engine=args.engine_max_background,
        api_key=args.engine_api_key or os.environ.get("ECLECTUS_ENGINE_API_KEY"),
        read_timeout_s=args.engine_timeout,
        probe_interval_s=args.engine_probe_interval,
        max_down_wait_s=args.engine_down_wait,
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
        loop = event_loop.loop_factory(args.loop)
        if args.engine_urls:
            backend = load_remote(args, wrap)
        else:
            process = getattr(args, "engine_process", "on") == "on"
            backend = load_engine(engine_config_from_args(args), wrap, process=process)
    except ValueError as exc:
        print(f"eclectus serve: {exc}", file=sys.stderr)
        return 2
    try:
        event_loop.run(serve_forever(config, backend), loop)
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
