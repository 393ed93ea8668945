"""Several front processes on one port: ``eclectus serve --api-server-count N`` (vLLM's flag).

One front process is one event loop, so it tops out at one core: ~1,100-1,250 short /v1
requests a second against an instant engine on the 2-core CPU VM, and ~7-11 ms of CPU a
request streaming 64 tokens from vLLM (docs/benchmarks.md). With N processes the parent
reserves the port (a socket bound with SO_REUSEPORT that never listens, so ``--port 0``
works), then spawns N workers that each listen on it with SO_REUSEPORT: the kernel spreads
new connections over their sockets by a hash of the connection. (One socket shared by all,
as uvicorn's workers do, does not spread a burst: asyncio accepts up to 100 waiting
connections per wake-up, so the first worker to wake takes them all.) Each worker is a
whole front (sessions, /v1, its own scheduler and engine pool) in front of the same engines.

- **A session stays on its process**: it is one WebSocket connection, accepted by one
  worker, which holds its graph for its life.
- **/v1 requests spread** by connection: each new connection goes to whichever worker
  accepts it (a keep-alive connection keeps its worker). Responses carry
  ``eclectus-worker: i``.
- **Shutdown drains every worker**: SIGTERM or SIGINT to the parent is passed to every
  worker as SIGTERM; each stops accepting, lets its in-flight work finish within
  ``--shutdown-timeout`` and exits; a second signal cuts them short. The parent exits when
  all have, with the first non-zero exit code if any. A worker that dies is not restarted
  (the others keep serving the port); the parent logs it.

Only remote engines (``--engine-url``) may sit behind several fronts: each worker would
otherwise load a built-in engine of its own, N copies of the weights and N KV pools that
share nothing, so ``--engine builtin`` or no ``--engine-url`` is refused. To put several
fronts before the built-in engine, serve it once (``eclectus serve --port 8100``) and point
the fronts at it with ``--engine-url http://127.0.0.1:8100/v1``. Limits that count work
(``--max-inflight``, ``--max-sessions``, ``--engine-max-inflight``...) are per worker.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import socket
import sys
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from types import FrameType

from eclectus.server.backend import Backend

log = logging.getLogger(__name__)
_START_TIMEOUT_S = 300.0  # a worker that never says it serves (its engines' handshakes hang)


def refusal(args: argparse.Namespace) -> str | None:
    """Why these flags cannot run several front processes, in one line (pure), or None."""
    count = args.api_server_count
    if not args.engine_urls:
        return (
            f"--api-server-count {count} needs --engine-url: each front process would load "
            "its own built-in engine; serve it once with `eclectus serve --port 8100` and "
            "give the fronts --engine-url http://127.0.0.1:8100/v1"
        )
    if args.engine == "builtin":
        return (
            f"--api-server-count {count} cannot run --engine builtin: each front process "
            "would load its own copy; serve it once and add it with --engine-url"
        )
    return None


def run_workers(args: argparse.Namespace, wrap: Callable[[Backend], Backend] | None) -> int:
    """Bind, start ``args.api_server_count`` workers on the socket, say where they serve,
    and wait for them (blocking); signals are passed on. 0 when all exit cleanly, 2 on
    bad flags or a worker that could not start."""
    from eclectus.server import event_loop
    from eclectus.server.flags import config_from_args
    from eclectus.server.main import serving_line

    reason = refusal(args) or ("the engine wrapper cannot cross processes" if wrap else None)
    if reason is not None:
        print(f"eclectus serve: {reason}", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args)
        event_loop.loop_factory(args.loop)  # uvloop asked for and missing: said here, once
    except ValueError as exc:
        print(f"eclectus serve: {exc}", file=sys.stderr)
        return 2
    reservation = _reserve(config.host, config.port)
    port = int(reservation.getsockname()[1])
    context = multiprocessing.get_context("spawn")
    ready: Queue[int] = context.Queue()
    workers = [
        context.Process(target=worker_main, args=(args, port, i, ready), name=f"eclectus-front-{i}")
        for i in range(args.api_server_count)
    ]
    for worker in workers:
        worker.start()

    def forward(signum: int, frame: FrameType | None) -> None:
        for worker in workers:
            if worker.is_alive() and worker.pid is not None:
                _terminate(worker.pid)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    if not _all_ready(workers, ready):
        forward(signal.SIGTERM, None)
        for worker in workers:
            worker.join()
        return 2
    reservation.close()  # the workers listen on the port now
    url = f"ws://{config.host}:{port}"
    print(f"{serving_line(config.model, url)} [{len(workers)} front processes]", file=sys.stderr)
    sys.stderr.flush()
    codes = []
    for i, worker in enumerate(workers):
        worker.join()
        if worker.exitcode:
            log.warning("front worker %d exited with code %s", i, worker.exitcode)
        codes.append(worker.exitcode or 0)
    return next((code for code in codes if code), 0)


def _reserve(host: str, port: int) -> socket.socket:
    """A socket bound to the port with SO_REUSEPORT that never listens: it holds the port
    (and picks one for port 0) while the workers start, and takes no connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _terminate(pid: int) -> None:
    """SIGTERM to ``pid``, which may have exited already (mutates)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def _all_ready(workers: list[multiprocessing.process.BaseProcess], ready: Queue[int]) -> bool:
    """Wait until every worker says it serves (blocking); False when one exits first."""
    pending = set(range(len(workers)))
    deadline = time.monotonic() + _START_TIMEOUT_S
    while pending and time.monotonic() < deadline:
        try:
            pending.discard(ready.get(timeout=0.2))
        except queue.Empty:
            if any(not workers[i].is_alive() for i in pending):
                print("eclectus serve: a front process failed to start", file=sys.stderr)
                return False
    return not pending


def worker_main(args: argparse.Namespace, port: int, index: int, ready: Queue[int]) -> None:
    """One worker: the flags' front, listening on ``port`` beside the others (SO_REUSEPORT)
    until SIGTERM (blocking). SIGINT is ignored: Ctrl-C reaches the whole process group, and
    the parent passes it on once."""
    from eclectus.server import event_loop
    from eclectus.server.flags import config_from_args
    from eclectus.server.front.app import bind
    from eclectus.server.main import load_remote, serve_forever
    from eclectus.server.remote.errors import RemoteStartError

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s [front {index}] %(name)s: %(message)s",
    )
    config = config_from_args(args)
    backend = load_remote(args, None)
    listener = bind(config.host, port, reuse_port=True)
    try:
        event_loop.run(
            serve_forever(
                config, backend, listener=listener, worker=index, on_ready=lambda: ready.put(index)
            ),
            event_loop.loop_factory(args.loop),
        )
    except RemoteStartError as exc:
        print(f"eclectus serve: {exc}", file=sys.stderr)
        sys.exit(2)
