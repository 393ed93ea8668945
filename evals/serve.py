"""``python -m eclectus.evals.serve``: an Eclectus server with its engine sized by a Budget.

``eclectus serve`` takes the engine's defaults; the evals start the server through this
module instead, in its own process (as vLLM runs in its own), so that the engine budgets
match the baseline's and the engine's calls can be traced for timelines
(:mod:`eclectus.evals.trace`). It prints ``READY <ws port> <openai port>`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from eclectus.evals.budget import Budget, GiB
from eclectus.server.config import ServerConfig


def build_parser() -> argparse.ArgumentParser:
    """The launcher's flags (pure)."""
    defaults = Budget()
    parser = argparse.ArgumentParser(prog="python -m eclectus.evals.serve", description=__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--openai-port", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=defaults.block_size)
    parser.add_argument("--kv-cache-gib", type=int, default=defaults.kv_cache_gib)
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens
    )
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument("--num-threads", type=int, default=defaults.num_threads)
    parser.add_argument("--trace-file", type=Path, default=None)
    return parser


def budget_args(budget: Budget) -> list[str]:
    """The flags that give this launcher ``budget`` (pure)."""
    return [
        "--block-size",
        str(budget.block_size),
        "--kv-cache-gib",
        str(budget.kv_cache_gib),
        "--max-num-batched-tokens",
        str(budget.max_num_batched_tokens),
        "--max-num-seqs",
        str(budget.max_num_seqs),
        "--num-threads",
        str(budget.num_threads),
    ]


async def serve(args: argparse.Namespace) -> None:
    """Start the engine and server, print READY, serve until SIGTERM/SIGINT."""
    from eclectus.evals.trace import TracingBackend
    from eclectus.server.app import start_server
    from eclectus.server.engine import AsyncEngine
    from eclectus.server.engine.engine_config import EngineConfig

    engine_config = EngineConfig(
        model=args.model,
        block_size=args.block_size,
        kv_cache_bytes=args.kv_cache_gib * GiB,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        num_threads=args.num_threads,
    )
    engine = await asyncio.to_thread(AsyncEngine.from_config, engine_config)
    backend = engine if args.trace_file is None else TracingBackend(engine, args.trace_file)
    config = ServerConfig(
        port=args.port, model=args.model, openai_port=args.openai_port, max_frame_bytes=1 << 24
    )
    server = await start_server(config, backend, owns_backend=True)  # type: ignore[arg-type]
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    assert server.openai_server is not None  # config.openai_port is always set here
    print(f"READY {server.port} {server.openai_server.port}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    Budget(
        args.block_size,
        args.kv_cache_gib,
        args.max_num_batched_tokens,
        args.max_num_seqs,
        args.num_threads,
    )  # validates
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
