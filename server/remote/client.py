"""One engine's HTTP API, as vLLM and SGLang serve it (OpenAI-compatible, plus /tokenize and
/metrics), over httpx. Holds one connection pool; every failure becomes EngineDown (try
another engine) or EngineRejected (the request itself was refused)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from eclectus.server.remote.errors import EngineDown, EngineRejected


class EngineClient:
    """The endpoints of one engine at ``url`` (its OpenAI base, ending in ``/v1``). Methods
    are pure apart from the network; :meth:`aclose` closes the connection pool."""

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
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        # no pool cap: the pool's per-engine in-flight cap is the one limit
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._http = httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits)
        # everything but a generation's stream: a hung engine must not stall the prober
        self._short = httpx.Timeout(probe_timeout_s, connect=connect_timeout_s)

    async def aclose(self) -> None:
        """Close the connection pool (mutates)."""
        await self._http.aclose()

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
            response = await self._http.get(f"{self.root}/metrics", timeout=self._short)
        except httpx.TransportError as exc:
            raise EngineDown(f"{self.url}: {_describe(exc)}") from None
        if response.status_code != 200:
            return None
        return response.text

    async def stream_completion(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """``POST /v1/completions`` with ``stream``: yield each SSE chunk until ``[DONE]``.
        Closing the iterator closes the connection, which aborts the request in vLLM and
        SGLang. A stream that ends without ``[DONE]`` raises EngineDown."""
        try:
            async with self._http.stream("POST", f"{self.url}/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    _raise_for(self.url, response)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:  # vLLM reports a failure inside the stream
                        raise EngineDown(f"{self.url}: {chunk['error']}")
                    yield chunk
        except httpx.TransportError as exc:
            raise EngineDown(f"{self.url}: {_describe(exc)}") from None
        except json.JSONDecodeError as exc:
            raise EngineDown(f"{self.url}: a stream chunk is not JSON ({exc})") from None
        raise EngineDown(f"{self.url}: the stream ended without [DONE]")

    async def _json(self, method: str, url: str, body: Any = None) -> dict[str, Any]:
        try:
            response = await self._http.request(method, url, json=body, timeout=self._short)
        except httpx.TransportError as exc:
            raise EngineDown(f"{self.url}: {_describe(exc)}") from None
        _raise_for(self.url, response)
        try:
            data = response.json()
        except ValueError:
            raise EngineDown(f"{url}: the answer is not JSON") from None
        if not isinstance(data, dict):
            raise EngineDown(f"{url}: the answer is not a JSON object")
        return data


def _raise_for(url: str, response: httpx.Response) -> None:
    """EngineDown for a 5xx, EngineRejected (with the engine's message) for a 4xx."""
    status = response.status_code
    if status < 400:
        return
    try:
        message = response.json().get("error", {}).get("message") or response.text
    except (ValueError, AttributeError):
        message = response.text
    text = f"{url}: HTTP {status}: {str(message).strip()[:500]}"
    if status >= 500:
        raise EngineDown(text)
    raise EngineRejected(text, status)


def _describe(exc: httpx.TransportError) -> str:
    """A short reason for a transport failure (httpx's messages are often empty)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
