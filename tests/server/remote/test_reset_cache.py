"""``POST /reset_prefix_cache`` in front of remote engines: forwarded to every engine as
vLLM (dev mode) and SGLang (``/flush_cache``) serve it, answered as vLLM answers it
(``{"success": bool}``), the front's own prediction of the engines' caches emptied with
them; an engine that cannot reset is a 502 naming it. Real sockets throughout: stub engines
for the client's dialects, real ``eclectus serve`` engines end to end."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from remote_helpers import EngineProcess, free_port, remote_backend, serve_http
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import start_server
from eclectus.server.remote.backend import RemoteBackend
from eclectus.server.remote.client import EngineClient
from eclectus.server.remote.errors import EngineRejected

PROMPT = "A ledger of the harbour's ships, their cargo and their ports of call. " * 12


def _engine(routes: dict[str, Response]) -> object:
    """A stub engine answering each path in ``routes``, 404 elsewhere; records the paths."""

    async def handle(request: Request) -> Response:
        handle.seen.append((request.method, request.url.path))  # type: ignore[attr-defined]
        return routes.get(request.url.path, JSONResponse({"error": "no"}, status_code=404))

    handle.seen = []  # type: ignore[attr-defined]
    return handle


@pytest.mark.parametrize(
    ("routes", "expected"),
    [
        ({"/reset_prefix_cache": JSONResponse({"success": True})}, True),  # vLLM
        ({"/reset_prefix_cache": JSONResponse({"success": False})}, False),  # blocks held
        ({"/reset_prefix_cache": Response(status_code=200)}, True),  # an empty 200
        ({"/flush_cache": PlainTextResponse("Cache flushed.")}, True),  # SGLang
        ({"/flush_cache": PlainTextResponse("busy", status_code=400)}, False),
    ],
)
async def test_the_client_resets_in_each_engines_dialect(
    routes: dict[str, Response], expected: bool
) -> None:
    handler = _engine(routes)
    server, url = await serve_http(handler)  # type: ignore[arg-type]
    client = EngineClient(url)
    try:
        assert await client.reset_prefix_cache() is expected
    finally:
        await client.aclose()
        await server.close()
    first = handler.seen[0]  # type: ignore[attr-defined]
    assert first == ("POST", "/reset_prefix_cache")  # vLLM's, at the root beside /v1


async def test_an_engine_with_no_reset_is_refused_with_the_flag_vllm_needs() -> None:
    server, url = await serve_http(_engine({}))  # type: ignore[arg-type]
    client = EngineClient(url)
    try:
        with pytest.raises(EngineRejected, match="VLLM_SERVER_DEV_MODE=1"):
            await client.reset_prefix_cache()
    finally:
        await client.aclose()
        await server.close()


@pytest.fixture(scope="module")
def dev_and_plain() -> Iterator[tuple[str, str]]:
    """Two real engines: one serving the reset (``--dev-endpoints``), one not."""
    dev = EngineProcess(free_port(), extra_args=("--dev-endpoints",)).start()
    plain = EngineProcess(free_port()).start()
    try:
        yield dev.wait_ready(), plain.wait_ready()
    finally:
        dev.stop()
        plain.stop()


@contextlib.asynccontextmanager
async def _front(urls: list[str], **config: Any) -> AsyncIterator[tuple[RemoteBackend, str]]:
    """A front over the engines at ``urls``: its backend and its HTTP URL; closed after."""
    backend = remote_backend(urls)
    server = await start_server(ServerConfig(port=0, **config), backend)
    try:
        yield backend, server.http_url
    finally:
        await server.close()


async def _cached(http: httpx.AsyncClient, url: str) -> int:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    answer = await http.post(f"{url}/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_the_front_resets_the_engines_cache_and_its_own_prediction(
    dev_and_plain: tuple[str, str],
) -> None:
    dev_url, _ = dev_and_plain
    async with (
        _front([dev_url], dev_endpoints=True) as (backend, url),
        httpx.AsyncClient(timeout=60) as http,
    ):
        await _cached(http, url)
        assert await _cached(http, url) > 100  # the engine holds the prompt
        assert len(backend.pool.engines[0].prefixes) > 0  # and the front predicts it
        reset = await http.post(f"{url}/reset_prefix_cache")
        assert (reset.status_code, reset.json()) == (200, {"success": True})
        assert len(backend.pool.engines[0].prefixes) == 0
        assert await _cached(http, url) == 0  # computed again


async def test_an_engine_that_cannot_reset_is_a_502_naming_it(
    dev_and_plain: tuple[str, str],
) -> None:
    dev_url, plain_url = dev_and_plain
    async with (
        _front([dev_url, plain_url], dev_endpoints=True) as (_, url),
        httpx.AsyncClient(timeout=60) as http,
    ):
        reset = await http.post(f"{url}/reset_prefix_cache")
        assert reset.status_code == 502
        error = reset.json()["error"]
        assert error["type"] == "server_error"
        assert plain_url in error["message"] and dev_url not in error["message"]
        assert "VLLM_SERVER_DEV_MODE=1" in error["message"]
        assert (await http.get(f"{url}/healthz")).status_code == 200  # it keeps serving


async def test_the_token_is_checked_before_the_endpoint_says_it_is_off(
    dev_and_plain: tuple[str, str],
) -> None:
    dev_url, _ = dev_and_plain
    async with _front([dev_url], token="secret") as (_, url), httpx.AsyncClient() as http:
        anonymous = await http.post(f"{url}/reset_prefix_cache")
        assert anonymous.status_code == 401
        signed = await http.post(
            f"{url}/reset_prefix_cache", headers={"Authorization": "Bearer secret"}
        )
        assert signed.status_code == 404 and "--dev-endpoints" in signed.text
