"""``eclectus serve`` (also ``python -m eclectus.server``): run the server until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from dataclasses import fields

from eclectus.server.config import ServerConfig


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
        "--token",
        default=None,
        help="require this token in hello (default: $ECLECTUS_TOKEN; unset: off)",
    )
    parser.add_argument("--max-frame-bytes", type=int, default=defaults.max_frame_bytes)
    parser.add_argument("--max-prompt-tokens", type=int, default=defaults.max_prompt_tokens)
    parser.add_argument("--max-vars-per-session", type=int, default=defaults.max_vars_per_session)
    parser.add_argument("--max-calls-per-session", type=int, default=defaults.max_calls_per_session)
    parser.add_argument("--max-sessions", type=int, default=defaults.max_sessions)
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=defaults.max_inflight,
        help="engine requests in flight at once, all sessions together",
    )
    parser.add_argument(
        "--max-background-inflight",
        type=int,
        default=defaults.max_background_inflight,
        help="throughput requests in flight while latency work is in flight",
    )
    parser.add_argument(
        "--aging-rate",
        type=float,
        default=defaults.aging_rate,
        help="app-FIFO aging: seconds of rank credit per second waited",
    )
    parser.add_argument(
        "--openai-port",
        type=int,
        default=None,
        help="also serve /v1/completions and /v1/chat/completions on this port",
    )
    parser.add_argument("--log-level", default="INFO")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig the flags describe: each flag whose dest names a field (pure apart
    from reading ECLECTUS_TOKEN)."""
    given = {f.name: getattr(args, f.name) for f in fields(ServerConfig) if hasattr(args, f.name)}
    given["token"] = args.token or ServerConfig.token_from_env()
    return ServerConfig(**given)


async def serve_forever(config: ServerConfig) -> None:
    """Serve until SIGINT/SIGTERM, then close cleanly."""
    from eclectus.server.app import start_server

    server = await start_server(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on every platform
            loop.add_signal_handler(sig, stop.set)
    print(
        f"eclectus serving {config.model} on {server.url} "
        f"(http: {server.http_url}/healthz, /metrics)",
        file=sys.stderr,
        flush=True,
    )
    if server.openai_url is not None:
        print(f"OpenAI-compatible API on {server.openai_url}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"eclectus serve: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve_forever(config))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eclectus.server", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
