"""The Eclectus server: one port, one ASGI application (Starlette on uvicorn).

On ``--port``: the WebSocket frame protocol at ``ws://host:port`` (any path), the
OpenAI-compatible API under ``/v1`` (openai_api.py), ``GET /healthz`` and ``GET /metrics``
(Prometheus text). Limits below the application (connections per client address, the
request-head deadline) live in connections.py; authentication in auth.py.

In-process API (tests, the demo, recipes, evals):
    server = await start_server(config, backend)      # async with server: ...
    with serve_in_thread(config, factory) as server:  # a server on its own loop and thread
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from types import TracebackType

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from eclectus.protocol import HELLO_ACCEPTED, HELLO_HEADER, ModelCard
from eclectus.server.backend import Backend
from eclectus.server.config import ServerConfig
from eclectus.server.event_loop import loop_factory
from eclectus.server.front.auth import Authenticator
from eclectus.server.front.connections import ConnectionGuard
from eclectus.server.front.metrics import CONTENT_TYPE, Metrics, Scrape
from eclectus.server.front.openai_api import SHUTTING_DOWN, OpenAIApi
from eclectus.server.front.prompt import Front
from eclectus.server.front.session import ServerContext, Session
from eclectus.server.front.transport import StarletteTransport
from eclectus.server.graph.scheduler import GraphScheduler

log = logging.getLogger(__name__)
_POLICY_VIOLATION = 1008
_LISTEN_BACKLOG = 2048  # uvicorn's default: a burst of new connections waits, not refused


def build_backend(model: str) -> Backend:
    """The built-in engine for ``model`` ("tiny" or a HF checkpoint directory). Imported
    lazily so that the server module itself never imports torch."""
    from eclectus.server.engine import AsyncEngine

    return AsyncEngine.from_config(model=model)


class EclectusServer:
    """A listening server. ``close`` is idempotent; ``async with`` closes on exit;
    ``drain`` lets in-flight work finish first (SIGTERM)."""

    def __init__(self, ctx: ServerContext, owns_backend: bool, worker: int | None = None) -> None:
        self.ctx = ctx
        self.owns_backend = owns_backend
        self.worker = worker  # this front process's index among several (None: the only one)
        self.guard = ConnectionGuard(
            ctx.config.max_connections_per_client,
            ctx.config.handshake_timeout_s,
            ctx.config.max_connections,
        )
        self.openai = OpenAIApi(ctx)
        self.connections: set[Session] = set()  # every WebSocket, with or without hello
        self.uvicorn: uvicorn.Server | None = None
        self.socket: socket.socket | None = None
        self._port: int | None = None  # kept after close (the socket then has no name)
        self._closed = False
        self.asgi = Starlette(
            routes=[
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/metrics", self.metrics_page, methods=["GET"]),
                *self.openai.routes(),
                WebSocketRoute("/{path:path}", self.websocket),
            ]
        )

    @property
    def backend(self) -> Backend:
        return self.ctx.backend

    @property
    def model(self) -> ModelCard:
        """The served model as clients see it (its name, window, chat template)."""
        return self.ctx.model

    @property
    def scheduler(self) -> GraphScheduler:
        return self.ctx.scheduler

    @property
    def metrics(self) -> Metrics:
        return self.ctx.metrics

    @property
    def port(self) -> int:
        assert self._port is not None, "not listening yet"
        return self._port

    @property
    def url(self) -> str:
        return f"ws://{self.ctx.config.host}:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.ctx.config.host}:{self.port}"

    @property
    def openai_url(self) -> str:
        """Base URL of the OpenAI-compatible endpoints (``…/v1``), on the same port."""
        return f"{self.http_url}/v1"

    # -- routes -----------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        if self.ctx.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        model, sessions = self.model.name, len(self.ctx.sessions)
        body: dict[str, object] = {"status": "ok", "model": model, "sessions": sessions}
        if self.worker is not None:
            body["worker"] = self.worker
        return JSONResponse(body)

    async def metrics_page(self, request: Request) -> Response:
        return Response(self.metrics_text(), media_type=CONTENT_TYPE)

    def metrics_text(self) -> str:
        """The /metrics page (pure): counts only, nothing about any tenant's prompts."""
        tenants = Counter(
            "none" if s.handle.tenant is None else s.handle.tenant
            for s in self.ctx.sessions
            if s.handle is not None
        )
        gauges = {
            **self.scheduler.gauges(),
            "connections": sum(self.guard.per_address.values()),
            "openai_requests": len(self.openai.jobs),
            "draining": float(self.ctx.draining),
        }
        counters = {
            "auth_failures": self.ctx.auth.num_failures,
            "connections_refused": self.guard.num_refused,
            "head_timeouts": self.guard.num_head_timeouts,
        }
        scrape = Scrape(self.backend.stats(), gauges, counters, dict(tenants))
        return self.metrics.render(scrape)

    async def websocket(self, ws: WebSocket) -> None:
        """One WebSocket connection: refused before the upgrade while shutting down or
        while its address is rate-limited for failed tokens, else one Session."""
        address = ws.client.host if ws.client else "unknown"
        if self.ctx.draining or self.ctx.auth.limiter.blocked(address):
            await ws.close(_POLICY_VIOLATION)  # before accept: the handshake gets a 403
            return
        # a hello in the upgrade request is answered right after the upgrade (one round
        # trip sooner); the response header tells the client not to send it again
        hello = ws.headers.get(HELLO_HEADER)
        if hello is None:
            await ws.accept()
        else:
            await ws.accept(headers=[(HELLO_HEADER.lower().encode(), HELLO_ACCEPTED.encode())])
        session = Session(StarletteTransport(ws), self.ctx, address)
        self.connections.add(session)
        try:
            await session.run(first=hello)
        finally:
            self.connections.discard(session)

    # -- lifecycle --------------------------------------------------------------------------

    async def listen(self, listener: socket.socket | None = None) -> None:
        """Bind the port (or serve ``listener``, a socket bound and listening already, which
        several front processes share) and start serving (mutates). OSError when the port
        is taken."""
        config = self.ctx.config
        sock = listener if listener is not None else bind(config.host, config.port)
        http, ws = self.guard.protocols()
        app = self.asgi if self.worker is None else WorkerHeader(self.asgi, self.worker)
        uv_config = uvicorn.Config(
            app,
            http=http,
            ws=ws,
            ws_max_size=config.max_socket_bytes,
            ws_per_message_deflate=False,
            lifespan="off",
            # the client address is the socket's peer: X-Forwarded-For would let a local
            # client pick a new address for every failed token
            proxy_headers=False,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=max(1, round(config.close_timeout_s)),
        )
        uv_config.load()
        server = uvicorn.Server(uv_config)
        server.lifespan = uv_config.lifespan_class(uv_config)
        await server.startup(sockets=[sock])
        self.socket, self.uvicorn = sock, server
        self._port = int(sock.getsockname()[1])

    def busy(self) -> bool:
        """Whether work is queued, in the engine, or still being tokenized (pure)."""
        scheduler = self.scheduler
        pending = scheduler.prompt_tokenizer.num_pending
        return scheduler.num_inflight > 0 or len(scheduler.queue) > 0 or pending > 0

    async def drain(self, timeout_s: float, force: asyncio.Event | None = None) -> None:
        """Shut down gracefully (mutates): stop accepting, let queued and in-flight work finish
        for up to ``timeout_s`` (or until ``force`` is set), then close, which fails what is
        left with a clear error."""
        self._stop_accepting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.busy() and loop.time() < deadline and not (force and force.is_set()):
            await asyncio.sleep(0.05)
        if self.busy():
            log.warning("shutdown: aborting work still in flight after %.1f s", timeout_s)
        await self.close()

    def _stop_accepting(self) -> None:
        self.ctx.draining = True
        if self.uvicorn is not None:
            for listener in self.uvicorn.servers:
                listener.close()

    async def close(self, message: str = SHUTTING_DOWN) -> None:
        """Stop listening, end every session and request (failing their pending work with
        ``message``), then stop the backend if this server built it (mutates; idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop_accepting()
        for session in list(self.connections):
            session.shut(message)
        await self.openai.abort_all(message)
        await self.scheduler.close_all(message)
        self.scheduler.prompt_tokenizer.close()
        timeout = self.ctx.config.close_timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.connections and loop.time() < deadline:  # their answers go out first
            await asyncio.sleep(0.01)
        if self.uvicorn is not None:
            await self.uvicorn.shutdown()
        if self.owns_backend:
            await self.backend.shutdown()
        gc.unfreeze()  # start_server froze the heap for the server's life, which ends here

    async def __aenter__(self) -> EclectusServer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on (host, port) (mutates: binds). OSError when taken.
    ``reuse_port``: SO_REUSEPORT, so that several front processes each listen on the port
    and the kernel spreads new connections over them (workers.py)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server(
        (host, port), family=family, backlog=_LISTEN_BACKLOG, reuse_port=reuse_port
    )
    # the same socket, its proto read from the fd (IPPROTO_TCP) instead of create_server's
    # 0: asyncio turns Nagle off (TCP_NODELAY) only on accepted sockets whose proto says
    # TCP, and with Nagle on a response's head and body, or two SSE events, wait out the
    # client's delayed ACK (40 ms on Linux) on every keep-alive request after the first
    return socket.socket(fileno=sock.detach())


class WorkerHeader:
    """ASGI middleware of a front worker: every HTTP response says which worker served it
    (``eclectus-worker``), for operators and tests of the spread."""

    def __init__(self, app: Starlette, worker: int) -> None:
        self.app, self.header = app, (b"eclectus-worker", str(worker).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        return await self.app(scope, receive, tagged)


async def start_server(
    config: ServerConfig,
    backend: Backend | None = None,
    *,
    owns_backend: bool | None = None,
    listener: socket.socket | None = None,
    worker: int | None = None,
    front: Front | None = None,
) -> EclectusServer:
    """Start the backend and listen (mutates: binds a port, unless ``listener``, a socket
    already listening, is given). ``backend`` None builds the built-in engine for
    ``config.model``; the server then owns it and shuts it down on close (``owns_backend``
    overrides). A backend passed in must tolerate ``start`` being called, and serve
    ``config.model``. ``worker``: this process's index among several front processes on
    one port (workers.py). ``front`` None: the front of ``config.model`` (its tokenizer and
    chat template: every prompt becomes ids there)."""
    owns = backend is None if owns_backend is None else owns_backend
    if front is None:  # reading the tokenizer blocks: keep the loop free for other servers
        front = await asyncio.to_thread(Front.load, config.model)
    if backend is None:  # loading weights blocks too
        backend = await asyncio.to_thread(build_backend, config.model)
    await backend.start()
    # the one prompt limit, said up front (welcome) and checked at submit and dispatch: a
    # prompt and at least one output token fit the window (the engine's counts the KV pool)
    card = front.card(backend.max_model_len)
    window = card.context_window
    if config.max_prompt_tokens > window - 1:
        config = dataclasses.replace(config, max_prompt_tokens=window - 1)
    if not config.served_model_names:
        config = dataclasses.replace(config, served_model_names=(card.name,))
    # what exists now (the model, torch, the tokenizer) lives as long as the server: out of
    # the cyclic collector's sight, so a full collection (which a burst of frames triggers)
    # scans the little that requests allocate, not a heap that stalls every session for 100s
    # of ms
    gc.freeze()
    metrics = Metrics()
    scheduler = GraphScheduler(backend, config, metrics, front=front)
    ctx = ServerContext(config, backend, scheduler, metrics, Authenticator(config), front, card)
    server = EclectusServer(ctx, owns, worker)
    try:
        await server.listen(listener)
    except BaseException:
        if owns:
            await backend.shutdown()
        raise
    log.info("eclectus listening on %s (model %s)", server.url, card.name)
    return server


@contextlib.contextmanager
def serve_in_thread(
    config: ServerConfig, backend_factory: Callable[[], Backend] | None = None
) -> Iterator[EclectusServer]:
    """Run a server on its own event loop in a daemon thread; yields once it listens, and
    closes it and joins the thread on exit. The factory runs on the server's thread, and the
    server owns (shuts down) what it builds. The loop is the one ``eclectus serve`` runs on."""
    loop = loop_factory()()
    started = threading.Event()
    holder: dict[str, EclectusServer | BaseException] = {}

    async def main() -> None:
        try:
            backend = backend_factory() if backend_factory is not None else None
            holder["server"] = await start_server(config, backend, owns_backend=True)
        except BaseException as exc:  # reported to the caller's thread below
            holder["error"] = exc
        finally:
            started.set()

    def target() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main())
        if "server" in holder:
            loop.run_forever()
        loop.close()

    thread = threading.Thread(target=target, name="eclectus-server", daemon=True)
    thread.start()
    started.wait()
    if "error" in holder:
        thread.join()
        raise RuntimeError("server failed to start") from holder["error"]  # type: ignore[misc]
    server = holder["server"]
    assert isinstance(server, EclectusServer)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=60)
