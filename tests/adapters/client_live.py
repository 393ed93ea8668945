"""The real server for the SDK's integration tests: built-in engine, tiny model, auth on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from eclectus.server.app import EclectusServer, serve_in_thread
from eclectus.server.config import ServerConfig

LIVE_TOKEN = "sdk-live-token"


@dataclass(frozen=True)
class LiveServer:
    """A running server and the token it requires."""

    server: EclectusServer
    token: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def client_frames(self) -> int:
        """Frames the server has received from all clients so far (its /metrics count)."""
        return self.server.metrics.client_frames


@contextmanager
def serve_live(**limits: int) -> Iterator[LiveServer]:
    """Serves on a free loopback port on its own loop thread until the block ends; ``limits``
    override ServerConfig fields (default here: max_prompt_tokens=2048)."""
    config = ServerConfig(
        port=0, model="tiny", token=LIVE_TOKEN, **{"max_prompt_tokens": 2048, **limits}
    )
    with serve_in_thread(config) as server:
        yield LiveServer(server, LIVE_TOKEN)
