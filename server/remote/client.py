"""One engine's HTTP API, as vLLM and SGLang serve it (OpenAI-compatible, plus /tokenize and
/metrics), over aiohttp. Holds one keep-alive connection pool; every failure becomes
EngineDown (try another engine) or EngineRejected (the request itself was refused).

aiohttp rather than httpx: every generated token crosses this client as one SSE chunk, and
aiohttp parses HTTP in C (llhttp) and reads the stream as lines without a text-decoding
layer; vLLM's own benchmark client and proxies use it for the same reason. A stream is read
to its end after ``[DONE]``, so its connection goes back to the pool instead of a new TCP
connection per request; one closed early is closed, which aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec

from eclectus.server.remote.errors import EngineDown, EngineRejected

# after [DONE] the engine ends the response at once; a stream still open after this long
# is closed (and its connection with it) rather than waited for
_END_GRACE_S = 1.0
# every streamed token arrives as one JSON chunk: msgspec decodes one ~4x faster than json
# (benchmarks/sse_json.py)
_DECODER = msgspec.json.Decoder()
# a request's body holds its whole prompt as ids: msgspec encodes 2,048 of them 12-15x faster
# than aiohttp's json= (json.dumps), which was a third of the front's CPU on long prompts
# (benchmarks/sse_json.py)
_ENCODER = msgspec.json.Encoder()
_JSON_HEADERS = {"Content-Type": "application/json"}
# a stream's line may hold a whole prompt's ids (vLLM's first chunk, return_token_ids): up
# to twice this many bytes (aiohttp's limit on one line)
_READ_BUFSIZE = 4 << 20
# an idle keep-alive connection is dropped after this long: below the 5 s after which vLLM's
# and SGLang's uvicorn close theirs (aiohttp's default, 15 s, would reuse connections the
# engine has closed, and a burst after a lull would meet a disconnect on each)
_KEEPALIVE_S = 2.0
# what a reused connection the engine closed under us raises before any answer: the request
# is sent once more, on a new connection (the engine aborts what it may have begun)
_STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


class EngineClient:
    """The endpoints of one engine at ``url`` (its OpenAI base, ending in ``/v1``). Methods
    are pure apart from the network; :meth:`aclose` closes the connection pool. The pool is
    opened on the first call, on the event loop that makes it."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
        probe_timeout_s: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        # vLLM serves /tokenize, /metrics and /health at the root, beside /v1
        self.root = self.url.removesuffix("/v1")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # a generation's stream: no total limit, but no silence longer than read_timeout_s
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=read_timeout_s
        )
        # everything but a generation's stream: a hung engine must not stall the prober
        self._short = aiohttp.ClientTimeout(total=probe_timeout_s, connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        """The connection pool, opened on first use (mutates). No cap on connections: the
        pool's per-engine in-flight cap is the one limit."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=_KEEPALIVE_S),
                timeout=self._stream_timeout,
                read_bufsize=_READ_BUFSIZE,
            )
        return self._session

    async def aclose(self) -> None:
        """Close the connection pool (mutates; idempotent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: the served models' cards."""
        data = await self._json("GET", f"{self.url}/models")
        return list(data.get("data", []))

    async def tokenize(self, model: str, text: str) -> list[int] | None:
        """The engine's ids for ``text`` with its special tokens (vLLM's ``POST /tokenize``,
        SGLang's ``/v1/tokenize``); None when the engine serves neither."""
        body = {"model": model, "prompt": text, "add_special_tokens": True}
        for url in (f"{self.root}/tokenize", f"{self.url}/tokenize"):
            try:
                data = await self._json("POST", url, body)
            except EngineRejected as exc:
                if exc.status in (404, 405):
                    continue
                raise
            tokens = data.get("tokens", data.get("input_ids"))
            if isinstance(tokens, list):
                return [int(t) for t in tokens]
        return None

    async def model_info(self) -> dict[str, Any] | None:
        """SGLang's ``GET /get_model_info`` (``model_path``, ``is_generation``...); None
        where the engine serves no such route (vLLM, Eclectus)."""
        try:
            return await self._json("GET", f"{self.root}/get_model_info")
        except EngineRejected:
            return None

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One non-streamed ``POST /v1/completions``."""
        return await self._json("POST", f"{self.url}/completions", body)

    async def metrics(self) -> str | None:
        """The ``/metrics`` page; None when the engine does not serve one there."""
        try:
            async with self._http().get(f"{self.root}/metrics", timeout=self._short) as response:
                if response.status != 200:
                    return None
                return await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineDown(f"{self.url}: {_describe(exc)}") from None

    async def reset_prefix_cache(self) -> bool:
        """Empty the engine's prefix cache: vLLM's dev-mode ``POST /reset_prefix_cache``
        (Eclectus serves it too), else SGLang's ``POST /flush_cache``. False when the
        engine kept it because requests still hold blocks (vLLM's ``{"success": false}``,
        SGLang's 400); EngineRejected when it serves neither (vLLM started without
        ``VLLM_SERVER_DEV_MODE=1``), EngineDown when it does not answer."""
        status, text = await self._post_empty(f"{self.root}/reset_prefix_cache")
        if status in (404, 405):
            status, text = await self._post_empty(f"{self.root}/flush_cache")
            if status in (404, 405):
                raise EngineRejected(
                    f"{self.url}: serves neither POST /reset_prefix_cache (vLLM: start it "
                    "with VLLM_SERVER_DEV_MODE=1) nor POST /flush_cache (SGLang)",
                    status,
                )
            return status == 200
        if status != 200:
            raise EngineDown(f"{self.url}: POST /reset_prefix_cache: HTTP {status}: {text[:200]}")
        try:
            answer = json.loads(text) if text.strip() else {}
        except ValueError:
            answer = {}
        return not isinstance(answer, dict) or answer.get("success", True) is not False

    async def _post_empty(self, url: str) -> tuple[int, str]:
        """``POST url`` with no body: the status and the answer's text (EngineDown when the
        engine does not answer)."""
        try:
            async with self._http().post(url, timeout=self._short) as response:
                return response.status, await response.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineDown(f"{self.url}: {_describe(exc)}") from None

    async def stream_completion(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """``POST /v1/completions`` with ``stream``: yield each SSE chunk until ``[DONE]``.
        Closing the iterator early closes the connection, which aborts the request in vLLM
        and SGLang. A stream that ends without ``[DONE]`` raises EngineDown."""
        try:
            async with await self._post(f"{self.url}/completions", body) as response:
                if response.status != 200:
                    await _raise_for(self.url, response)
                async for line in response.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        await _read_to_end(response)
                        return
                    chunk = _DECODER.decode(data)
                    if "error" in chunk:  # vLLM reports a failure inside the stream
                        raise EngineDown(f"{self.url}: {chunk['error']}")
                    yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineDown(f"{self.url}: {_describe(exc)}") from None
        except ValueError as exc:  # not JSON (msgspec.DecodeError), or a line over the limit
            raise EngineDown(f"{self.url}: a bad stream chunk ({exc})") from None
        raise EngineDown(f"{self.url}: the stream ended without [DONE]")

    async def _post(self, url: str, body: dict[str, Any]) -> aiohttp.ClientResponse:
        """The response to ``POST url``, its head read; sent again, once, when the
        connection fails before any answer (a keep-alive connection the engine closed)."""
        data = _ENCODER.encode(body)
        try:
            return await self._http().post(url, data=data, headers=_JSON_HEADERS)
        except _STALE_CONNECTION as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):
                raise  # no connection was made: the engine is not there
            return await self._http().post(url, data=data, headers=_JSON_HEADERS)

    async def _json(self, method: str, url: str, body: Any = None) -> dict[str, Any]:
        try:
            request = self._http().request(method, url, json=body, timeout=self._short)
            async with request as response:
                await _raise_for(self.url, response)
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineDown(f"{self.url}: {_describe(exc)}") from None
        try:
            data = json.loads(text)
        except ValueError:
            raise EngineDown(f"{url}: the answer is not JSON") from None
        if not isinstance(data, dict):
            raise EngineDown(f"{url}: the answer is not a JSON object")
        return data


async def _read_to_end(response: aiohttp.ClientResponse) -> None:
    """Read what follows ``[DONE]`` (the chunked body's end), so the connection is reused;
    give up after a moment (the connection is then closed instead)."""
    try:
        async with asyncio.timeout(_END_GRACE_S):
            await response.content.read()
    except (TimeoutError, aiohttp.ClientError):
        pass


async def _raise_for(url: str, response: aiohttp.ClientResponse) -> None:
    """EngineDown for a 5xx, EngineRejected (with the engine's message) for a 4xx (reads
    the body of a failed response)."""
    status = response.status
    if status < 400:
        return
    text = await response.text(errors="replace")
    try:
        message = json.loads(text).get("error", {}).get("message") or text
    except (ValueError, AttributeError):
        message = text
    detail = f"{url}: HTTP {status}: {str(message).strip()[:500]}"
    if status >= 500:
        raise EngineDown(detail)
    raise EngineRejected(detail, status)


def _describe(exc: BaseException) -> str:
    """A short reason for a transport failure (the library's messages are often empty)."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
