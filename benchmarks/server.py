"""The client-side benchmarks' one door to an in-process server.

The SDK and the framework adapters import nothing from ``eclectus.server`` (a client-only
install has no engine; tests/adapters/test_no_server_imports.py checks it). Their
benchmarks (``benchmarks/client.py``, ``benchmarks/llamaindex.py``) start a tiny-model
server in their own process on purpose, and do it here, importing the server only when they
run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def server_url(url: str | None, token: str | None = None) -> Iterator[str]:
    """``url`` itself, or the URL of a tiny-model server run in this process until the
    block ends (imports the server and its engine)."""
    if url is not None:
        yield url
        return
    from eclectus.server.config import ServerConfig
    from eclectus.server.front.app import serve_in_thread

    with serve_in_thread(ServerConfig(port=0, model="tiny", token=token)) as server:
        yield server.url
