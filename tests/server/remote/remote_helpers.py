"""Real engines for the remote backend's tests: ``eclectus serve --model tiny`` processes
serving the OpenAI-compatible API, and small real HTTP servers that stand in for an engine
(a recording proxy, a fake engine with another tokenizer).

Where an engine's OpenAI base URL is found is decided in :func:`engine_command` and
:func:`engine_url_in`: the OpenAI API is on the main port (``http://host:PORT/v1``).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tool_fixtures import weather_tool
from websockets.asyncio.client import connect
from ws_helpers import RawClient

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, start_server
from eclectus.server.remote import RemoteConfig, build_remote_backend
from eclectus.server.remote.backend import RemoteBackend

STARTUP_TIMEOUT_S = 120.0


def free_port() -> int:
    """A loopback port nobody listens on now (a restarted engine takes it again)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def engine_command(port: int, model: str = "tiny") -> list[str]:
    """The command line of an engine whose OpenAI API listens on ``port``."""
    return [
        sys.executable,
        "-m",
        "eclectus",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        "--num-threads",
        "1",
        "--num-kv-blocks",
        "512",
    ]


def engine_url_in(line: str) -> str | None:
    """The OpenAI base URL an engine's start-up line announces, if this is that line."""
    match = re.search(r"OpenAI API: (http://\S+/v1)\)", line)
    return match.group(1) if match else None


@dataclass
class EngineProcess:
    """One ``eclectus serve`` engine process; :meth:`kill` and :meth:`restart` for
    failover tests (same port, so the pool finds it again)."""

    port: int
    proc: subprocess.Popen[str] | None = None
    url: str = ""
    log: list[str] = field(default_factory=list)
    extra_args: tuple[str, ...] = ()  # more `eclectus serve` flags

    def start(self) -> EngineProcess:
        """Launch without waiting (mutates); :meth:`wait_ready` waits."""
        command = [*engine_command(self.port), *self.extra_args]
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, bufsize=1)
        return self

    def wait_ready(self) -> str:
        """Block until the engine announces its URL; return it."""
        assert self.proc is not None and self.proc.stderr is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for line in self.proc.stderr:
            self.log.append(line)
            url = engine_url_in(line)
            if url is not None:
                self.url = url
                return url
            if time.monotonic() > deadline:
                break
        raise RuntimeError("engine never became ready:\n" + "".join(self.log[-20:]))

    def kill(self) -> None:
        """SIGKILL: the engine vanishes mid-stream, as a crashed one does (mutates)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def restart(self) -> str:
        self.start()
        return self.wait_ready()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_engines(count: int) -> list[EngineProcess]:
    """``count`` engines started in parallel, each ready."""
    engines = [EngineProcess(free_port()).start() for _ in range(count)]
    for engine in engines:
        engine.wait_ready()
    return engines


Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class HttpServer:
    """A loopback uvicorn server running one Starlette handler for every path."""

    server: uvicorn.Server
    port: int

    async def close(self) -> None:
        await self.server.shutdown()


async def serve_http(handler: Handler) -> tuple[HttpServer, str]:
    """A real loopback HTTP server (Starlette on uvicorn, as Eclectus's own) running
    ``handler`` for every request; its OpenAI-style base URL."""
    app = Starlette(routes=[Route("/{path:path}", handler, methods=["GET", "POST"])])
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    port = int(sock.getsockname()[1])
    return HttpServer(server, port), f"http://127.0.0.1:{port}/v1"


class RecordingProxy:
    """Forwards every request to an engine and records each JSON body it received. It can
    take capabilities away from the real engine behind it, as other engines lack them:
    ``drop_fields`` are removed from completion bodies before forwarding (an engine that
    ignores fields it does not know), ``no_tokenize`` answers 404 on the tokenize routes,
    ``text_only`` refuses token-id prompts with a 400, ``cut_after`` ends every completion
    stream after that many events, without ``[DONE]`` (a dropped connection).
    ``open_at_chunk`` maps a streamed body's index in ``bodies`` to, for each chunk relayed,
    the indices of the streams then open (its own included): what the engine was running
    beside it."""

    def __init__(
        self,
        target: str,
        fail_streams: bool = False,
        *,
        drop_fields: tuple[str, ...] = (),
        no_tokenize: bool = False,
        text_only: bool = False,
        cut_after: int | None = None,
    ) -> None:
        self.target_root = target.removesuffix("/v1")
        self.bodies: list[dict[str, Any]] = []
        self.fail_streams = fail_streams  # answer every streamed completion with a 503
        self.drop_fields = drop_fields
        self.no_tokenize = no_tokenize
        self.text_only = text_only
        self.cut_after = cut_after
        self._http = httpx.AsyncClient(timeout=120)
        self.open_streams: set[int] = set()
        self.open_at_chunk: dict[int, list[frozenset[int]]] = {}

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw) if raw else None
        if self.no_tokenize and request.url.path in ("/tokenize", "/v1/tokenize"):
            return JSONResponse({"error": {"message": "not found"}}, status_code=404)
        index = None  # this body's place in ``bodies``
        if body is not None and request.url.path == "/v1/completions":
            index = len(self.bodies)
            self.bodies.append(body)
            if self.fail_streams and body.get("stream"):
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
            if self.text_only and isinstance(body.get("prompt"), list):
                message = "prompt: a string is needed"
                return JSONResponse({"error": {"message": message}}, status_code=400)
            if any(name in body for name in self.drop_fields):
                body = {k: v for k, v in body.items() if k not in self.drop_fields}
                raw = json.dumps(body).encode()
        headers = {"content-type": "application/json"} if raw else {}
        upstream = self._http.build_request(
            request.method, self.target_root + request.url.path, content=raw, headers=headers
        )
        response = await self._http.send(upstream, stream=True)
        kind = response.headers.get("content-type", "application/json")
        if "event-stream" in kind:
            relay = _relay(response) if self.cut_after is None else _cut(response, self.cut_after)
            if index is not None:
                relay = self._tracked(relay, index)
            return StreamingResponse(relay, status_code=response.status_code, media_type=kind)
        content = await response.aread()
        return Response(content, status_code=response.status_code, media_type=kind)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _tracked(self, relay: AsyncIterator[bytes], index: int) -> AsyncIterator[bytes]:
        """``relay``, noting the open streams at each chunk (mutates ``open_at_chunk``)."""
        self.open_streams.add(index)
        seen = self.open_at_chunk.setdefault(index, [])
        try:
            async for chunk in relay:
                seen.append(frozenset(self.open_streams))
                yield chunk
        finally:
            self.open_streams.discard(index)


async def _relay(response: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        await response.aclose()


async def _cut(response: httpx.Response, num_events: int) -> AsyncIterator[bytes]:
    """Relay the first ``num_events`` SSE events, then stop as a broken connection does."""
    try:
        async for line in response.aiter_lines():
            if line.startswith("data:") and num_events <= 0:
                return
            yield (line + "\n").encode()
            if line.startswith("data:"):
                num_events -= 1
    finally:
        await response.aclose()


def fake_engine(tokens: list[int], max_model_len: int = 4096) -> Handler:
    """An engine that answers /v1/models and /tokenize (with ``tokens`` for any text) and
    nothing else: a server running a model with another tokenizer."""

    async def handle(request: Request) -> Response:
        if request.url.path == "/v1/models":
            card = {"id": "other-model", "object": "model", "max_model_len": max_model_len}
            return JSONResponse({"object": "list", "data": [card]})
        if request.url.path == "/tokenize":
            answer = {"tokens": tokens, "count": len(tokens), "max_model_len": max_model_len}
            return JSONResponse(answer)
        return JSONResponse({"error": {"message": "not found"}}, status_code=404)

    return handle


# -- graphs through a front server --------------------------------------------------------


def remote_backend(urls: list[str], **config: Any) -> RemoteBackend:
    config.setdefault("probe_interval_s", 0.2)
    return build_remote_backend(RemoteConfig(model="tiny", engine_urls=tuple(urls), **config))


async def run_graph(server: EclectusServer, frame: dict[str, Any], num: int, **hello: Any) -> Any:
    """Submit ``frame`` in a new session and collect ``num`` answers (var -> frame)."""
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello(**hello)
        await client.send(frame)
        answers = {}
        while len(answers) < num:
            got = await client.recv(timeout=120)
            if got["type"] in ("value", "error") and "var" in got:
                answers[got["var"]] = got
        return answers


def fan_out(num: int, max_tokens: int = 24, criteria: str = "latency") -> dict[str, Any]:
    """``num`` independent calls sharing a long constant prefix, each got."""
    frame: dict[str, Any] = {"type": "submit", "vars": [], "calls": [], "gets": []}
    for i in range(num):
        frame["calls"].append(
            {
                "id": f"c{i}",
                "template": "You are a careful assistant. Answer briefly.\n"
                f"Question {i}: what is {i} plus {i}?\nAnswer:{{{{a{i}}}}}",
                "bind": {f"a{i}": f"a{i}"},
                "sampling": {f"a{i}": {"max_tokens": max_tokens, "ignore_eos": True}},
            }
        )
        frame["gets"].append({"var": f"a{i}", "criteria": criteria})
    return frame


async def reference(builtin: object, frame: dict[str, Any], num: int) -> dict[str, str]:
    server = await start_server(ServerConfig(port=0), builtin, owns_backend=False)  # type: ignore[arg-type]
    try:
        return {k: v["text"] for k, v in (await run_graph(server, frame, num)).items()}
    finally:
        await server.close()


# -- structured outputs ------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "count", "ok"],
}
REGEX = "[a-z]{2,5}-[0-9]{2}"
CHOICES = ["red", "green", "blue"]
GRAMMAR = 'root ::= "yes" | "no" | "maybe"'
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "json": {"json": SCHEMA},
    "json_object": {"json_object": True},
    "regex": {"regex": REGEX},
    "choice": {"choice": CHOICES},
    "grammar": {"grammar": GRAMMAR},
}


def constrained_frame(
    kinds: list[str], compact: bool = False, ignore_eos: bool = False
) -> dict[str, Any]:
    """One call per constraint kind, each output constrained and got; ``compact``: no
    whitespace between JSON tokens (``disable_any_whitespace``); ``ignore_eos`` asks for
    it on every call (a constrained reply still ends where its grammar does)."""
    frame: dict[str, Any] = {"type": "submit", "vars": [], "calls": [], "gets": []}
    for kind in kinds:
        constraint = dict(CONSTRAINTS[kind])
        if compact and kind.startswith("json"):
            constraint["disable_any_whitespace"] = True
        frame["calls"].append(
            {
                "id": f"c_{kind}",
                "template": f"Reply in {kind} form.\nReply:{{{{{kind}}}}}",
                "bind": {kind: kind},
                "sampling": {
                    kind: {
                        "max_tokens": 48,
                        "structured_outputs": constraint,
                        **({"ignore_eos": True} if ignore_eos else {}),
                    }
                },
            }
        )
        frame["gets"].append({"var": kind})
    return frame


def assert_valid(kind: str, text: str) -> None:
    """``text`` satisfies the constraint of ``kind``."""
    if kind == "json":
        value = json.loads(text)
        assert set(value) == {"name", "count", "ok"}
        assert isinstance(value["name"], str) and len(value["name"]) <= 8
        assert isinstance(value["count"], int) and 0 <= value["count"] <= 99
        assert isinstance(value["ok"], bool)
    elif kind == "json_object":
        assert isinstance(json.loads(text), dict)
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "choice":
        assert text in CHOICES
    else:
        assert text in ("yes", "no", "maybe")


# a bounded city, so that a constrained call closes within a few tokens
WEATHER = weather_tool(max_city_length=12)
