"""The embedded default server: Eclectus with the built-in engine on a free loopback port, in a
background thread.

Both modes can then run against the same engine on that one port: Eclectus mode over the
WebSocket protocol, openai mode over ``/v1`` (the stock way, one prompt per request), and both
read the same ``/metrics`` page.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eclectus.recipes.target import Backend, Target
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, serve_in_thread

if TYPE_CHECKING:
    from eclectus.server.engine import EngineConfig

MAX_BODY_BYTES = 1 << 24  # a long document's prompts fit


@dataclass(frozen=True, slots=True)
class Embedded:
    """A running embedded server's addresses."""

    server: EclectusServer

    @property
    def openai_url(self) -> str:
        return self.server.openai_url

    @property
    def metrics_url(self) -> str:
        return f"{self.server.http_url}/metrics"

    @property
    def model(self) -> str:
        return self.server.model.name

    def target(self, backend: Backend, use_compile: bool = True) -> Target:
        """A Target for one mode on this server (pure)."""
        url = self.server.url if backend == "eclectus" else self.openai_url
        return Target(
            backend, url, self.model, metrics_url=self.metrics_url, use_compile=use_compile
        )


@contextlib.contextmanager
def embedded_server(model: str = "tiny", engine: EngineConfig | None = None) -> Iterator[Embedded]:
    """Start the server for ``model`` (its built-in engine as ``engine`` says, when given:
    its ``model`` must be ``model``); stop it on exit."""
    if engine is not None and engine.model != model:
        raise ValueError(f"engine.model is {engine.model!r}, the server's model is {model!r}")
    config = ServerConfig(port=0, model=model, max_frame_bytes=MAX_BODY_BYTES)
    factory = None
    if engine is not None:
        from eclectus.server.engine import AsyncEngine  # torch: only when asked

        factory = functools.partial(AsyncEngine.from_config, engine)
    with serve_in_thread(config, factory) as server:
        yield Embedded(server)
