"""OpenAI-compatible completions and chat completions over the engine, driven the stock way.

This is how an unmodified OpenAI client (``openai``, ``langchain_openai``) reaches Eclectus's
own engine: one prompt per request, no graph, no template boundaries. It exists so that evals
can separate what the graph buys from what the engine buys (the ``self`` baseline), and so that
any OpenAI client can use the server. Requests go straight to the Backend; the graph scheduler
is not involved.

Supported: ``POST /v1/completions`` (prompt: a string or a list of strings), ``POST
/v1/chat/completions`` (string or text-part message contents), ``GET /v1/models``; ``stream``
with ``stream_options.include_usage``; ``max_tokens`` / ``max_completion_tokens``,
``temperature``, ``top_p``, ``seed``, ``stop`` and the vLLM extensions ``top_k`` and
``ignore_eos``. Anything else that would change the output (``n`` > 1, logprobs, penalties,
tools) is refused with a 400 naming the field, never silently ignored.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.backend import Backend, EngineError, EngineOutput, EngineRequest
from eclectus.server.http_server import HttpRequest, HttpResponse

ChatRenderer = Callable[[list[dict[str, str]]], str]
_request_ids = itertools.count()


class ApiError(Exception):
    """An OpenAI-style error: HTTP status, message, and the offending parameter."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": None}}


class _Sampling(BaseModel):
    """Fields common to both endpoints. Unknown fields are ignored (clients send many
    defaults), but the ones that would change the output are checked below."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # chat's newer name
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    ignore_eos: bool = False

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> _Sampling:
        if self.n != 1:
            raise ValueError("n: only n=1 is supported")
        extra = self.model_extra or {}
        for name in ("logprobs", "top_logprobs", "tools", "functions", "logit_bias", "echo"):
            if extra.get(name) not in (None, False, 0, [], {}):
                raise ValueError(f"{name}: not supported by this server")
        for name in ("frequency_penalty", "presence_penalty"):
            if extra.get(name) not in (None, 0, 0.0):
                raise ValueError(f"{name}: only 0 is supported")
        return self

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_tokens or self.max_completion_tokens or default_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=tuple(stop),
            ignore_eos=self.ignore_eos,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_Sampling):
    prompt: str | list[str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ValueError(f"messages.content: part type {part.get('type')!r} unsupported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


def parse(model: type[_Sampling], body: bytes) -> Any:
    """Validate a JSON body into ``model``; raises ApiError(400) naming the field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, f"{where}: {first['msg']}" if where else first["msg"], where) from None


class OpenAIApi:
    """The endpoint handlers over one Backend. Holds no per-request state."""

    def __init__(
        self,
        backend: Backend,
        render_chat: ChatRenderer,
        token: str | None = None,
        max_tokens: int = 16,
    ) -> None:
        self.backend = backend
        self.render_chat = render_chat
        self.token = token
        self.default_max_tokens = max_tokens

    async def handle(self, request: HttpRequest) -> HttpResponse:
        """Route one HTTP request (the http_server Handler). Errors become OpenAI-style
        error bodies; the engine state is untouched by a refused request."""
        try:
            self._authorize(request)
            route = (request.method, request.path)
            if route == ("GET", "/v1/models"):
                return HttpResponse.json(200, self.models())
            if route == ("POST", "/v1/completions"):
                result = await self.completions(request.body)
            elif route == ("POST", "/v1/chat/completions"):
                result = await self.chat_completions(request.body)
            else:
                raise ApiError(404, f"no route for {request.method} {request.path}")
        except ApiError as exc:
            return HttpResponse.json(exc.status, exc.body())
        if isinstance(result, dict):
            return HttpResponse.json(200, result)
        return HttpResponse(200, result, content_type="text/event-stream")

    def _authorize(self, request: HttpRequest) -> None:
        if self.token is None:
            return
        if request.headers.get("authorization", "") != f"Bearer {self.token}":
            raise ApiError(401, "missing or wrong bearer token")

    def models(self) -> dict[str, Any]:
        card = self.backend.model
        entry = {
            "id": card.name,
            "object": "model",
            "created": 0,
            "owned_by": "eclectus",
            "max_model_len": card.context_window,
        }
        return {"object": "list", "data": [entry]}

    async def completions(self, body: bytes) -> dict[str, Any] | AsyncIterator[bytes]:
        request: CompletionRequest = parse(CompletionRequest, body)
        prompts = [request.prompt] if isinstance(request.prompt, str) else request.prompt
        if not prompts:
            raise ApiError(400, "prompt: must not be empty", "prompt")
        if request.stream and len(prompts) != 1:
            raise ApiError(400, "prompt: streaming takes a single prompt", "prompt")
        return await self._run(request, prompts, chat=False)

    async def chat_completions(self, body: bytes) -> dict[str, Any] | AsyncIterator[bytes]:
        request: ChatCompletionRequest = parse(ChatCompletionRequest, body)
        try:
            messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        except ValueError as exc:
            raise ApiError(400, str(exc), "messages") from None
        return await self._run(request, [self.render_chat(messages)], chat=True)

    async def _run(
        self, request: _Sampling, prompts: list[str], chat: bool
    ) -> dict[str, Any] | AsyncIterator[bytes]:
        try:
            params = request.sampling_params(self.default_max_tokens)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        base = f"{'chatcmpl' if chat else 'cmpl'}-{next(_request_ids)}"
        requests = [
            EngineRequest(
                request_id=f"{base}-{i}",
                segments=(p,),
                sampling=params,
                tokens=self.backend.tokenize_prompt((p,)),  # here, not on the step thread
            )
            for i, p in enumerate(prompts)
        ]
        if request.stream:
            return self._stream(requests[0], base, chat, request.include_usage)
        return _response(base, self.backend.model.name, chat, await self._collect_all(requests))

    async def _collect_all(
        self, requests: list[EngineRequest]
    ) -> list[tuple[str, EngineOutput, int]]:
        """Every request of a list prompt at once, so the engine batches them (mutates:
        submits them). The first failure cancels the others, which aborts them."""
        tasks = [asyncio.ensure_future(_collect(self.backend.generate(r))) for r in requests]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _stream(
        self, request: EngineRequest, base: str, chat: bool, include_usage: bool
    ) -> AsyncIterator[bytes]:
        name, created = self.backend.model.name, int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        last: EngineOutput | None = None
        num_output = 0
        if chat:  # the first chunk carries the role, as OpenAI's does
            yield _sse(_chunk(base, kind, name, created, {"role": "assistant", "content": ""}))
        async for out in self.backend.generate(request):
            last, num_output = out, num_output + len(out.token_ids)
            if out.text or out.finished:
                delta = {"content": out.text} if chat else out.text
                yield _sse(_chunk(base, kind, name, created, delta, out.finish_reason))
        if include_usage and last is not None:
            usage = _usage(last.num_prompt_tokens, num_output, last.num_cached_tokens)
            yield _sse(
                {
                    "id": base,
                    "object": kind,
                    "created": created,
                    "model": name,
                    "choices": [],
                    "usage": usage,
                }
            )
        yield b"data: [DONE]\n\n"


async def _collect(stream: AsyncIterator[EngineOutput]) -> tuple[str, EngineOutput, int]:
    """Drain one request: (text, last output, output tokens). EngineError -> ApiError(500)."""
    pieces: list[str] = []
    last: EngineOutput | None = None
    num_output = 0
    try:
        async for out in stream:
            pieces.append(out.text)
            num_output += len(out.token_ids)
            last = out
    except EngineError as exc:
        raise ApiError(500, f"engine error: {exc}") from None
    assert last is not None and last.finished, "engine stream ended without a final output"
    return "".join(pieces), last, num_output


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _response(
    base: str, name: str, chat: bool, results: list[tuple[str, EngineOutput, int]]
) -> dict[str, Any]:
    choices = []
    for index, (text, last, _) in enumerate(results):
        choice: dict[str, Any] = {"index": index, "finish_reason": last.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        choices.append(choice)
    usage = _usage(
        sum(r[1].num_prompt_tokens for r in results),
        sum(r[2] for r in results),
        sum(r[1].num_cached_tokens for r in results),
    )
    return {
        "id": base,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": choices,
        "usage": usage,
    }


def _chunk(
    base: str, kind: str, name: str, created: int, delta: Any, finish: str | None = None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if isinstance(delta, dict):
        choice["delta"] = delta
    else:
        choice.update(text=delta, logprobs=None)
    return {"id": base, "object": kind, "created": created, "model": name, "choices": [choice]}


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
