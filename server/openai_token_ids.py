"""vLLM's token-level extensions of the OpenAI API: what an Eclectus must serve to be another
Eclectus's engine (``eclectus serve --engine-url``, docs/engines.md).

- ``POST /v1/completions`` with ``prompt`` as token ids (a list of ints, or a list of such
  lists): the ids go to the engine as they are, one engine request per prompt. A token
  prompt has no text segments for the graph to reuse, so it does not become a graph: it is
  a direct engine request (the in-flight caps and app-FIFO of the scheduler do not apply;
  the engine's own batching and priority do), with the authenticated tenant.
- ``return_token_ids`` (also on text prompts served this way): each choice and each stream
  chunk lists its generated ids, so a remote backend can continue a request exactly after
  a failover.
- ``POST /tokenize`` ``{"prompt", "add_special_tokens"}`` -> ``{"tokens", "count",
  "max_model_len"}``, the ids a text prompt becomes here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response, StreamingResponse

from eclectus.protocol import SamplingParams
from eclectus.server.backend import (
    Backend,
    EngineError,
    EngineOutput,
    EngineRequest,
    TokenizedPrompt,
)
from eclectus.server.openai_schema import ApiError, sse, sse_chunk

TokenIds = list[Annotated[int, Field(ge=0)]]


class TokenizeRequest(BaseModel):
    """vLLM's ``POST /tokenize`` body (the completion form; ``messages`` is not taken)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


def tokenize(backend: Backend, request: TokenizeRequest) -> dict[str, Any]:
    """The /tokenize answer (pure)."""
    if request.add_special_tokens:
        tokens = list(backend.tokenize_prompt((request.prompt,)).token_ids)
    else:
        tokens = backend.tokenize(request.prompt)
    window = backend.model.context_window
    return {"tokens": tokens, "count": len(tokens), "max_model_len": window}


def token_prompts(prompt: object) -> list[list[int]] | None:
    """The prompt's token-id lists, None for a text prompt (pure)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return [list(prompt)]  # type: ignore[arg-type]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        return [list(p) for p in prompt]
    return None


def check_token_ids(prompts: list[list[int]], vocab_size: int | None) -> None:
    """Refuse empty prompts and ids the model has no embedding for, before they reach a
    batch shared with other requests."""
    for ids in prompts:
        if not ids:
            raise ApiError(400, "prompt: must not be empty", "prompt")
        if vocab_size is not None and max(ids) >= vocab_size:
            raise ApiError(400, f"prompt: token id {max(ids)} >= {vocab_size}", "prompt")


async def run_token_prompts(
    backend: Backend,
    base: str,
    name: str,
    prompts: list[list[int]],
    sampling: SamplingParams,
    *,
    tenant: str | None,
    stream: bool,
    include_usage: bool,
) -> Response:
    """Serve token-id prompts straight from the engine (mutates: engine requests)."""
    requests = [
        EngineRequest(
            request_id=f"{base}-{i}",
            segments=("",),
            sampling=sampling,
            tenant=tenant,
            tokens=TokenizedPrompt(tuple(ids), (len(ids),)),
        )
        for i, ids in enumerate(prompts)
    ]
    if stream:
        events = _stream(backend, requests[0], base, name, include_usage)
        return StreamingResponse(events, media_type="text/event-stream")
    tasks = [asyncio.ensure_future(_collect(backend.generate(r))) for r in requests]
    try:
        results = list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return JSONResponse(_response(base, name, results))


Collected = tuple[str, EngineOutput, list[int]]  # text, last output, generated ids


async def _collect(stream: AsyncIterator[EngineOutput]) -> Collected:
    """Drain one request. EngineError -> ApiError(500)."""
    pieces: list[str] = []
    token_ids: list[int] = []
    last: EngineOutput | None = None
    try:
        async for out in stream:
            pieces.append(out.text)
            token_ids += out.token_ids
            last = out
    except EngineError as exc:
        raise ApiError(500, f"engine error: {exc}") from None
    assert last is not None and last.finished, "engine stream ended without a final output"
    return "".join(pieces), last, token_ids


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _response(base: str, name: str, results: list[Collected]) -> dict[str, Any]:
    choices = [
        {
            "index": i,
            "text": text,
            "logprobs": None,
            "finish_reason": last.finish_reason,
            "token_ids": ids,
        }
        for i, (text, last, ids) in enumerate(results)
    ]
    usage = _usage(
        sum(r[1].num_prompt_tokens for r in results),
        sum(len(r[2]) for r in results),
        sum(r[1].num_cached_tokens for r in results),
    )
    return {
        "id": base,
        "object": "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": choices,
        "usage": usage,
    }


async def _stream(
    backend: Backend, request: EngineRequest, base: str, name: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """SSE events with each chunk's ids; a disconnect closes this generator, which closes
    the engine stream (aborting the request)."""
    created, kind = int(time.time()), "text_completion"
    last: EngineOutput | None = None
    num_output = 0
    outputs = backend.generate(request)
    try:
        async for out in outputs:
            last, num_output = out, num_output + len(out.token_ids)
            if out.text or out.finished or out.token_ids:
                chunk = sse_chunk(base, kind, name, created, out.text, out.finish_reason)
                chunk["choices"][0]["token_ids"] = list(out.token_ids)
                yield sse(chunk)
    except EngineError as exc:
        yield sse(ApiError(500, f"engine error: {exc}").body())
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
    if include_usage and last is not None:
        usage = _usage(last.num_prompt_tokens, num_output, last.num_cached_tokens)
        yield sse(sse_chunk(base, kind, name, created, None, usage=usage))
    yield b"data: [DONE]\n\n"
