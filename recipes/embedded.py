"""The embedded default server: Eclectus with the built-in engine, plus its OpenAI-compatible
listener, on free loopback ports in a background thread.

Both modes can then run against the same engine: Eclectus mode over the WebSocket protocol,
openai mode over ``/v1`` (the stock way, one prompt per request), and both read the same
``/metrics`` page.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from eclectus.recipes.target import Backend, Target
from eclectus.server.app import EclectusServer, serve_in_thread
from eclectus.server.config import ServerConfig

MAX_BODY_BYTES = 1 << 24  # a long document's prompts fit


@dataclass(frozen=True, slots=True)
class Embedded:
    """A running embedded server's addresses."""

    server: EclectusServer
    openai_url: str

    @property
    def metrics_url(self) -> str:
        return f"{self.server.http_url}/metrics"

    @property
    def model(self) -> str:
        return self.server.backend.model.name

    def target(self, backend: Backend, use_compile: bool = True) -> Target:
        """A Target for one mode on this server (pure)."""
        url = self.server.url if backend == "eclectus" else self.openai_url
        return Target(backend, url, self.model, metrics_url=self.metrics_url,
                      use_compile=use_compile)


@contextlib.contextmanager
def embedded_server(model: str = "tiny") -> Iterator[Embedded]:
    """Start the server (both listeners) for ``model``; stop it on exit."""
    fields = {f.name for f in dataclasses.fields(ServerConfig)}
    if "openai_port" in fields:  # the server starts its own OpenAI listener
        config = ServerConfig(port=0, model=model, openai_port=0)  # type: ignore[call-arg]
        with serve_in_thread(config) as server:
            yield Embedded(server, server.openai_url)  # type: ignore[attr-defined]
        return
    with serve_in_thread(ServerConfig(port=0, model=model)) as server, _openai_listener(
        server
    ) as url:
        yield Embedded(server, url)


@contextlib.contextmanager
def _openai_listener(server: EclectusServer) -> Iterator[str]:
    """The OpenAI endpoints over ``server``'s backend, on the server's own loop (until the
    server starts them itself from ServerConfig.openai_port)."""
    from eclectus.server.http_server import start_http_server
    from eclectus.server.openai_api import OpenAIApi

    assert server.ws_server is not None
    loop = server.ws_server.server.get_loop()
    backend = server.backend
    render = backend.engine.tokenizer.apply_chat_template  # type: ignore[attr-defined]
    api = OpenAIApi(backend, render)
    start = start_http_server(api.handle, "127.0.0.1", 0, max_body_bytes=MAX_BODY_BYTES)
    http = asyncio.run_coroutine_threadsafe(start, loop).result(timeout=30)
    try:
        yield f"http://127.0.0.1:{http.sockets[0].getsockname()[1]}/v1"
    finally:

        async def stop() -> None:
            http.close()
            # Python 3.11 has no Server.close_clients: end the keep-alive connections'
            # handler tasks, or the loop closes on them pending.
            handlers = [t for t in asyncio.all_tasks()
                        if t.get_coro().__qualname__.endswith("on_connection")]  # type: ignore[union-attr]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            await http.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=30)
