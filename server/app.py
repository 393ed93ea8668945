"""The Eclectus server: one port for the WebSocket protocol and plain HTTP observability.

``ws://host:port`` (any path) speaks the frame protocol; a plain ``GET /healthz`` or
``GET /metrics`` on the same port is answered during the opening handshake (websockets'
``process_request``), so no second listener is needed.

In-process API (tests, the demo, the SDK's tests):
    server = await start_server(config, backend)      # async with server: ...
    with serve_in_thread(config, factory) as server:  # a server on its own loop and thread
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http
import json
import logging
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from eclectus.server.backend import Backend
from eclectus.server.config import ServerConfig
from eclectus.server.http_server import HttpServer
from eclectus.server.metrics import Metrics
from eclectus.server.scheduler import Scheduler
from eclectus.server.session import ServerContext, Session

log = logging.getLogger(__name__)


def build_backend(model: str) -> Backend:
    """The built-in engine for ``model`` ("tiny" or a HF checkpoint directory). Imported
    lazily so that the server module itself never imports torch."""
    from eclectus.server.engine import AsyncEngine

    return AsyncEngine.from_config(model=model)


def chat_renderer(backend: Backend) -> Callable[[list[dict[str, str]]], str]:
    """The engine tokenizer's chat template when the backend has one (the built-in engine),
    else a plain "role: content" rendering (pure)."""
    tokenizer = getattr(getattr(backend, "engine", None), "tokenizer", None)
    render = getattr(tokenizer, "apply_chat_template", None)
    if callable(render):
        return render  # type: ignore[no-any-return]
    return lambda messages: (
        "".join(f"{m['role']}: {m['content']}\n" for m in messages) + ("assistant:")
    )


def _with_type(response: Response, content_type: str) -> Response:
    """Replace the plain-text Content-Type that ``respond`` sets (mutates ``response``)."""
    del response.headers["Content-Type"]  # Headers is a multidict: assigning would append
    response.headers["Content-Type"] = content_type
    return response


class EclectusServer:
    """A listening server. ``close`` is idempotent; ``async with`` closes on exit."""

    def __init__(
        self, ctx: ServerContext, owns_backend: bool, ws_server: Server | None = None
    ) -> None:
        self.ctx = ctx
        self.owns_backend = owns_backend
        self.ws_server = ws_server
        self.openai_server: HttpServer | None = None  # the OpenAI-compatible listener
        self._closed = False

    @property
    def backend(self) -> Backend:
        return self.ctx.backend

    @property
    def scheduler(self) -> Scheduler:
        return self.ctx.scheduler

    @property
    def metrics(self) -> Metrics:
        return self.ctx.metrics

    @property
    def port(self) -> int:
        assert self.ws_server is not None
        return int(next(iter(self.ws_server.sockets)).getsockname()[1])

    @property
    def url(self) -> str:
        return f"ws://{self.ctx.config.host}:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.ctx.config.host}:{self.port}"

    @property
    def openai_url(self) -> str | None:
        """Base URL of the OpenAI-compatible endpoints (``…/v1``), None when not served."""
        if self.openai_server is None:
            return None
        port = self.openai_server.port
        return f"http://{self.ctx.config.host}:{port}/v1"

    def metrics_text(self) -> str:
        """The /metrics page (pure)."""
        return self.metrics.render(self.backend.stats(), self.scheduler.gauges)

    async def handle(self, ws: ServerConnection) -> None:
        """One connection (the websockets handler)."""
        await Session(ws, self.ctx).run()

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """Answer plain HTTP GETs; let WebSocket upgrades through."""
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            body = {
                "status": "ok",
                "model": self.backend.model.name,
                "sessions": len(self.ctx.sessions),
            }
            text = json.dumps(body) + "\n"
            return _with_type(connection.respond(http.HTTPStatus.OK, text), "application/json")
        if path == "/metrics":
            response = connection.respond(http.HTTPStatus.OK, self.metrics_text())
            return _with_type(response, "text/plain; version=0.0.4; charset=utf-8")
        if "websocket" not in request.headers.get("Upgrade", "").lower():
            return connection.respond(http.HTTPStatus.NOT_FOUND, "not found\n")
        return None

    async def close(self) -> None:
        """Stop listening, end every session (cancelling its work), then stop the backend
        if this server built it (mutates; idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.openai_server is not None:
            await self.openai_server.close()
        if self.ws_server is not None:
            self.ws_server.close()
            await self.ws_server.wait_closed()
        for app in list(self.scheduler.apps.values()):
            await self.scheduler.close_app(app)
        if self.owns_backend:
            await self.backend.shutdown()

    async def __aenter__(self) -> EclectusServer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def start_server(
    config: ServerConfig, backend: Backend | None = None, *, owns_backend: bool | None = None
) -> EclectusServer:
    """Start the backend and listen (mutates: binds a port). ``backend`` None builds the
    built-in engine for ``config.model``; the server then owns it and shuts it down on close
    (``owns_backend`` overrides). A backend passed in must tolerate ``start`` being called."""
    owns = backend is None if owns_backend is None else owns_backend
    if backend is None:  # loading weights blocks: keep the loop free for other servers
        backend = await asyncio.to_thread(build_backend, config.model)
    await backend.start()
    # a prompt can never be longer than the model's window: say so up front (welcome, checks)
    window = backend.model.context_window
    if config.max_prompt_tokens > window:
        config = dataclasses.replace(config, max_prompt_tokens=window)
    if not config.served_model_names:
        config = dataclasses.replace(config, served_model_names=(backend.model.name,))
    metrics = Metrics()
    ctx = ServerContext(config, backend, Scheduler(backend, config, metrics), metrics)
    server = EclectusServer(ctx, owns)
    server.ws_server = await serve(
        server.handle,
        config.host,
        config.port,
        process_request=server.process_request,
        max_size=config.max_socket_bytes,
        close_timeout=config.close_timeout_s,
    )
    if config.openai_port is not None:
        await _start_openai(server)
    log.info("eclectus listening on %s (model %s)", server.url, backend.model.name)
    return server


async def _start_openai(server: EclectusServer) -> None:
    """Serve the OpenAI-compatible endpoints on ``config.openai_port`` (mutates: binds)."""
    from eclectus.server.http_server import start_http_server
    from eclectus.server.openai_api import OpenAIApi

    config = server.ctx.config
    api = OpenAIApi(server.backend, chat_renderer(server.backend), token=config.token)
    assert config.openai_port is not None
    server.openai_server = await start_http_server(
        api.handle, config.host, config.openai_port, max_body_bytes=config.max_frame_bytes
    )
    log.info("OpenAI-compatible endpoints on %s", server.openai_url)


@contextlib.contextmanager
def serve_in_thread(
    config: ServerConfig, backend_factory: Callable[[], Backend] | None = None
) -> Iterator[EclectusServer]:
    """Run a server on its own event loop in a daemon thread; yields once it listens, and
    closes it and joins the thread on exit. The factory runs on the server's thread, and the
    server owns (shuts down) what it builds."""
    loop = asyncio.new_event_loop()
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
