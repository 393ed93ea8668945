"""The OpenAI-compatible API's wire side: request schemas, the one conversion to the server's
sampling parameters, OpenAI-shaped errors, and the response and SSE payload builders (all pure).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from starlette.responses import JSONResponse

from eclectus.protocol import SamplingParams
from eclectus.protocol.openai_tools import ChatConstraint, assistant_message

if TYPE_CHECKING:
    from eclectus.server.graph.graph import Variable

# sampling fields this server does not implement, each with its neutral value (vLLM's
# default), the one value accepted, besides null
_NEUTRAL = {
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "repetition_penalty": 1,
    "min_p": 0,
}

_ERROR_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "server_error",
    501: "server_error",
    502: "server_error",  # an engine behind the front failed what was asked of it
    503: "service_unavailable",
}


class ApiError(Exception):
    """An OpenAI-style error: HTTP status, message, the offending parameter and a code."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(self.status, "invalid_request_error")
        error = {"message": str(self), "type": kind, "param": self.param, "code": self.code}
        return {"error": error}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


# Fields vLLM's request schemas let be null, meaning "the default" (the openai client sends
# ``"temperature": null`` for ``temperature=None``): here null is read as the field's default
NULL_IS_DEFAULT = ("temperature", "top_p", "top_k", "stream", "return_token_ids")


class OpenAIRequest(BaseModel):
    """Fields common to both endpoints. Unknown fields are ignored (clients send many
    defaults), but the ones that would change the output are checked below. A null is
    accepted wherever vLLM accepts one, as the default."""

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
    ignore_eos: bool = False  # vLLM's extension
    skip_special_tokens: bool = True  # vLLM's extension
    stop_token_ids: list[int] | None = None  # vLLM's extension
    return_token_ids: bool = False  # vLLM's extension (token-id prompts list their ids)
    # vLLM's extension: the request's rank among this server's requests, lower first (as
    # vLLM's --scheduling-policy priority); what an outer Eclectus sends its engines
    priority: int = Field(default=0, ge=-(2**62), le=2**62)
    # vLLM's extension: a stream's tokens per chunk (the first and the last chunk at once);
    # what an outer Eclectus sends for calls nobody watches token by token
    stream_interval: int | None = Field(default=None, ge=1)

    @field_validator(*NULL_IS_DEFAULT, mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        return cls.model_fields[info.field_name].default if value is None else value

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> OpenAIRequest:
        if self.n not in (1, None):  # None: chat's null, its default
            raise ValueError("n: only n=1 is supported")
        extra = self.model_extra or {}
        for name in ("logprobs", "top_logprobs", "functions", "logit_bias", "echo"):
            if extra.get(name) not in (None, False, 0, [], {}):
                raise ValueError(f"{name}: not supported by this server")
        for name, default in _NEUTRAL.items():
            if extra.get(name) not in (None, default):
                raise ValueError(f"{name}: only {default} is supported")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


def to_sampling(request: OpenAIRequest, default_max_tokens: int | None) -> SamplingParams:
    """The one place an OpenAI request's fields become the server's sampling parameters
    (pure; ApiError(400) when they are out of range). ``default_max_tokens``: what a request
    naming none gets (16 for /v1/completions as OpenAI documents; None for chat: until EOS or
    the context window, as vLLM does)."""
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    try:
        return SamplingParams(
            max_tokens=request.max_tokens or request.max_completion_tokens or default_max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            seed=request.seed,
            stop=tuple(stop),
            ignore_eos=request.ignore_eos,
            skip_special_tokens=request.skip_special_tokens,
            stop_token_ids=tuple(request.stop_token_ids or ()),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, f"{where}: {first['msg']}", where) from None


class CompletionRequest(OpenAIRequest):
    # text, or token ids as vLLM takes them (served by openai_token_ids.py)
    prompt: (
        str
        | list[str]
        | list[Annotated[int, Field(ge=0)]]
        | list[list[Annotated[int, Field(ge=0)]]]
    )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn answers this call

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it (transformers' shape); raises ValueError
        for a content part that is not text."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [_template_call(c) for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ValueError(f"messages.content: part type {part.get('type')!r} unsupported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call with its JSON-string arguments parsed, as templates render them."""
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):  # else rendered as the string it is
            function["arguments"] = json.loads(arguments)
    return {**call, "function": function}


class ChatCompletionRequest(OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    n: int | None = 1  # vLLM's chat schema lets it be null (its completions schema does not)


def parse(model: type[OpenAIRequest], body: bytes) -> Any:
    """Validate a JSON body into ``model``; raises ApiError(400) naming the field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, f"{where}: {first['msg']}" if where else first["msg"], where) from None


def usage_of(variables: list[Variable]) -> dict[str, Any]:
    prompt = sum(v.usage.prompt_tokens for v in variables if v.usage)
    completion = sum(v.usage.completion_tokens for v in variables if v.usage)
    cached = sum(v.usage.cached_tokens for v in variables if v.usage)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def completion_response(
    base: str,
    name: str,
    chat: bool,
    results: list[Variable],
    constraint: ChatConstraint | None = None,
) -> dict[str, Any]:
    """The whole (non-streamed) response; a chat reply's tool calls parsed per
    ``constraint`` (pure)."""
    choices = []
    for index, variable in enumerate(results):
        choice: dict[str, Any] = {"index": index, "finish_reason": variable.finish_reason}
        if chat:
            message, finish = assistant_message(
                variable.value or "", variable.finish_reason, constraint or ChatConstraint()
            )
            choice.update(message=message, finish_reason=finish)
        else:
            choice.update(text=variable.value or "", logprobs=None)
        choices.append(choice)
    return {
        "id": base,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": choices,
        "usage": usage_of(results),
    }


def sse_chunk(
    base: str,
    kind: str,
    name: str,
    created: int,
    delta: Any,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One SSE payload; ``delta`` None: the usage-only chunk with no choices (pure)."""
    payload: dict[str, Any] = {"id": base, "object": kind, "created": created, "model": name}
    if delta is None:
        payload.update(choices=[], usage=usage)
        return payload
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if isinstance(delta, dict):
        choice["delta"] = delta
    else:
        choice.update(text=delta, logprobs=None)
    payload["choices"] = [choice]
    return payload


_ENCODER = msgspec.json.Encoder()


def sse(payload: dict[str, Any]) -> bytes:
    """One SSE event (pure). msgspec, not ``json``: one event per streamed token, and it
    encodes one ~11x faster (compact separators, UTF-8 as is: the same JSON values;
    ``benchmarks/sse_json.py``)."""
    return b"data: " + _ENCODER.encode(payload) + b"\n\n"
