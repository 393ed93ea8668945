"""OpenAI-compatible completions and chat completions, on the same port as everything else.

This is how an unmodified OpenAI client (``openai``, ``langchain_openai``) reaches Eclectus:
one prompt per call, no template boundaries. Each request becomes an ordinary graph in the
scheduler, one call per prompt, activated with the criteria ``latency`` (the default of a
get): the same in-flight caps, the same app-FIFO fairness against WebSocket sessions, the
same prompt limits, and the authenticated tenant (so the prefix cache, and ``cached_tokens``,
are shared only within it). A client that leaves aborts its request, streaming or not.

Supported: ``POST /v1/completions`` (prompt: a string or a list of at most
``max_prompts_per_request`` strings, or vLLM's token ids, each list one call likewise:
openai_token_ids.py), ``POST /v1/chat/completions`` (string or text-part
message contents), ``GET /v1/models``; ``stream`` with ``stream_options.include_usage``;
``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop`` and
the vLLM extensions ``top_k``, ``ignore_eos``, ``stop_token_ids``, ``priority`` (lower is
scheduled first, within the latency class every /v1 request has), ``stream_interval`` (a
stream's tokens per chunk, first and last chunk at once) and ``return_token_ids``
(generated ids per choice and chunk; on chat also the prompt's); on chat, tools and
structured outputs (read by :mod:`eclectus.protocol.openai_tools`: ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``response_format``, vLLM's ``structured_outputs``); on completions
the same structured outputs without tools (vLLM's /v1/completions takes them, and an Eclectus
serving as another's engine must enforce them). Anything else
that would change the output (``n`` > 1, logprobs, penalties, ``functions``) is refused with a
400 naming the field, never silently ignored. Errors have OpenAI's body shape,
``{"error": {"message", "type", "param", "code"}}``, with vLLM's status codes: 400 bad
request, 401 bad token, 404 unknown model or route, 413 body too large, 429 too many failed
tokens, 500 engine failure, 503 shutting down.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from eclectus.protocol import CallSpec, GenSegment, SamplingParams, Submit, TextSegment
from eclectus.protocol.openai_tools import (
    ChatConstraint,
    ChatDeltas,
    ToolRequestError,
    chat_constraint,
    with_constraint,
)
from eclectus.protocol.sampling import COMPLETIONS_DEFAULT_MAX_TOKENS
from eclectus.protocol.tool_formats import ToolFormatName
from eclectus.server.backend import EngineError, EngineOutput, RequestRefused, check_constraint
from eclectus.server.errors import ServerError
from eclectus.server.front.app_handle import AppHandle
from eclectus.server.front.auth import AuthFailure, bearer_token
from eclectus.server.front.openai_schema import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIRequest,
    completion_response,
    parse,
    sse,
    sse_chunk,
    to_sampling,
    usage_of,
)
from eclectus.server.front.openai_token_ids import (
    TokenizeRequest,
    check_token_ids,
    token_prompts,
    tokenize,
)
from eclectus.server.front.prompt import Prompt
from eclectus.server.front.session import ServerContext
from eclectus.server.graph.fragment import stage
from eclectus.server.graph.graph import Variable, VarState
from eclectus.server.graph.objectives import objective_for_get

SHUTTING_DOWN = "the server is shutting down"
PromptInput = str | list[int]  # text, or token ids (openai_token_ids.py)
Chunk = tuple[int, str, tuple[int, ...]]  # prompt index, new text, new token ids


@dataclass(slots=True, eq=False)
class _Job:
    """One request's graph in the scheduler and what its outputs have produced so far."""

    handle: AppHandle
    outputs: list[str]  # output var ids, one per prompt
    streaming: bool  # whether text and ids are queued as they come (SSE) or only finals
    interval: int = 1  # a stream's tokens per chunk (``stream_interval``)
    chunks: asyncio.Queue[Chunk | Variable] = field(default_factory=asyncio.Queue)
    num_final: int = 0
    token_ids: list[list[int]] = field(init=False)  # a whole response's generated ids
    index: dict[str, int] = field(init=False)  # output var id -> prompt index
    # a stream's output not yet queued (text, ids), and whether its first chunk went
    held: tuple[str, tuple[int, ...]] = ("", ())
    started: bool = False

    def __post_init__(self) -> None:
        self.token_ids = [[] for _ in self.outputs]
        self.index = {var_id: i for i, var_id in enumerate(self.outputs)}

    def on_output(self, var_id: str, output: EngineOutput) -> None:
        """An engine output of prompt ``var_id``'s call: a whole response keeps its ids and
        waits for the final variables; a stream queues it (mutates). A stream queues its
        first output at once, then one chunk per ``interval`` tokens, and what is left with
        the final output (vLLM's ``stream_interval``); its chunks carry the ids."""
        index = self.index[var_id]
        if not self.streaming:
            self.token_ids[index] += output.token_ids
            return
        text, ids = self.held
        text, ids = text + output.text, ids + output.token_ids
        due = not self.started or len(ids) >= self.interval or output.finished
        if due and (text or ids):
            self.chunks.put_nowait((index, text, ids))  # a stream has one prompt
            self.started = True
            text, ids = "", ()
        self.held = (text, ids)


class OpenAIApi:
    """The /v1 routes over one server's context. Holds no per-request state but the set of
    requests in flight (for shutdown)."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.jobs: set[_Job] = set()
        self.closed = False  # set by abort_all: the server is closing, nothing more runs
        # the served model's call syntax: the flag's, else its card's (its template's), as
        # the welcome announces it to SDK clients
        card = ctx.model.with_tool_call_format(ctx.config.tool_call_parser)
        self.tool_format: ToolFormatName = card.tool_call_format

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),  # vLLM's, at the root
            Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]),  # likewise
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/{rest:path}", self.not_found, methods=["GET", "POST"]),
        ]

    # -- endpoints --------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        try:
            self._admit(request)
        except ApiError as exc:
            return self._error(request, exc)
        window = self.ctx.model.context_window
        entries = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "eclectus",
                "max_model_len": window,
            }
            for name in self.ctx.config.served_model_names
        ]
        return self._count(request, JSONResponse({"object": "list", "data": entries}))

    async def not_found(self, request: Request) -> Response:
        error = ApiError(404, f"no route for {request.method} {request.url.path}")
        return self._error(request, error)

    async def completions(self, request: Request) -> Response:
        try:
            tenant = self._admit(request)
            body: CompletionRequest = parse(CompletionRequest, await self._body(request))
            constraint = completion_constraint(body.model_extra or {})
            token_ids = token_prompts(body.prompt)
            prompts: Sequence[PromptInput]
            if token_ids is not None:  # scheduled like text (openai_token_ids.py)
                self._check_prompts(token_ids, body.stream)
                self._check_token_ids(token_ids)
                prompts = token_ids
            else:
                text = body.prompt
                prompts = [text] if isinstance(text, str) else text  # type: ignore[assignment]
                self._check_prompts(prompts, body.stream)
            with_ids = token_ids is not None or body.return_token_ids
            return await self._run(
                request, tenant, body, prompts, False, constraint, with_ids=with_ids
            )
        except ApiError as exc:
            return self._error(request, exc)

    async def tokenize(self, request: Request) -> Response:
        """vLLM's ``POST /tokenize`` (openai_token_ids.py)."""
        try:
            self._admit(request)
            body = await self._body(request)
            try:
                tokenize_request = TokenizeRequest.model_validate_json(body)
            except ValidationError as exc:
                raise ApiError(400, str(exc.errors()[0]["msg"])) from None
            prompt_tokenizer = self.ctx.scheduler.prompt_tokenizer
            window = self.ctx.model.context_window
            answer = await tokenize(window, prompt_tokenizer, tokenize_request)
            return JSONResponse(answer)
        except ApiError as exc:
            return self._error(request, exc)

    async def reset_prefix_cache(self, request: Request) -> Response:
        """vLLM's dev-mode ``POST /reset_prefix_cache``: the engines forget every cached
        prefix no request holds before they take the next request (``--dev-endpoints``).
        Answers as vLLM does, ``{"success": bool}``: false when an engine kept its cache
        because requests hold its blocks (retry). A remote engine that cannot reset is a
        502 naming it. The token is checked first, so the 404 tells only a client that
        may call it that the endpoint is off."""
        try:
            self._admit(request)
            if not self.ctx.config.dev_endpoints:
                raise ApiError(404, "POST /reset_prefix_cache needs eclectus serve --dev-endpoints")
            reset = getattr(self.ctx.backend, "reset_prefix_cache", None)
            if reset is None:
                raise ApiError(501, "this server's engines cannot reset their prefix cache")
            try:
                success = await reset()
            except EngineError as exc:
                raise ApiError(502, str(exc)) from None
            return JSONResponse({"success": bool(success)})
        except ApiError as exc:
            return self._error(request, exc)

    async def chat_completions(self, request: Request) -> Response:
        try:
            tenant = self._admit(request)
            body: ChatCompletionRequest = parse(ChatCompletionRequest, await self._body(request))
            try:
                constraint = chat_constraint(body.model_extra or {}, self.tool_format)
            except ToolRequestError as exc:
                raise ApiError(400, str(exc), exc.param) from None
            try:
                messages = [m.for_template() for m in body.messages]
            except ValueError as exc:
                raise ApiError(400, str(exc), "messages") from None
            prompt = self.ctx.front.render_chat(messages, tools=constraint.tools or None)
            return await self._run(
                request,
                tenant,
                body,
                [prompt],
                chat=True,
                constraint=constraint,
                with_ids=body.return_token_ids,
            )
        except ApiError as exc:
            return self._error(request, exc)

    # -- checks -----------------------------------------------------------------------------

    def _admit(self, request: Request) -> str | None:
        """The request's tenant; ApiError when it may not be served (mutates: counts an
        authentication failure)."""
        if self.ctx.draining:
            raise ApiError(503, SHUTTING_DOWN)
        token = bearer_token(request.headers.get("authorization"))
        address = request.client.host if request.client else "unknown"
        try:
            return self.ctx.auth.authenticate(token, address).tenant
        except AuthFailure as exc:
            status = 429 if exc.rate_limited else 401
            raise ApiError(status, str(exc), code="invalid_api_key") from None

    async def _body(self, request: Request) -> bytes:
        """The body, refused with 413 as soon as it passes the limit (reads the request)."""
        limit = self.ctx.config.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"body of {declared} bytes, limit {limit}")
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > limit:
                raise ApiError(413, f"body over the limit of {limit} bytes")
        return bytes(body)

    def _check_prompts(self, prompts: Sequence[PromptInput], stream: bool) -> None:
        if not prompts:
            raise ApiError(400, "prompt: must not be empty", "prompt")
        limit = self.ctx.config.max_prompts_per_request
        if len(prompts) > limit:
            raise ApiError(400, f"prompt: {len(prompts)} prompts, limit {limit}", "prompt")
        if stream and len(prompts) != 1:
            raise ApiError(400, "prompt: streaming takes a single prompt", "prompt")

    def _check_token_ids(self, prompts: list[list[int]]) -> None:
        """ApiError(400) for an empty or too long token-id prompt, or an id outside the
        vocabulary (pure): text prompts are checked by ``stage``, ids here."""
        vocab = self.ctx.front.vocab_size
        check_token_ids(prompts, vocab, self.ctx.config.max_prompt_tokens)

    async def _check_constraint(self, sampling: SamplingParams) -> None:
        """ApiError(400) when the engine cannot serve the request's structured outputs (a
        schema, regex or grammar it does not compile; a max_tokens too small for any valid
        output), before anything is dispatched. Compiles on a worker thread (cached)."""
        try:
            await asyncio.to_thread(check_constraint, self.ctx.backend, sampling)
        except RequestRefused as exc:
            raise ApiError(400, str(exc)) from None

    def _check_model(self, name: str | None) -> None:
        """ApiError(404) in OpenAI's words for a model not served here (ServerConfig.serves
        decides; the WebSocket API's ServerError says the same in its own shape)."""
        if not self.ctx.config.serves(name):
            message = f"The model `{name}` does not exist."
            raise ApiError(404, message, "model", code="model_not_found")

    # -- running ----------------------------------------------------------------------------

    async def _run(
        self,
        request: Request,
        tenant: str | None,
        body: OpenAIRequest,
        prompts: Sequence[PromptInput],
        chat: bool,
        constraint: ChatConstraint | None = None,
        *,
        with_ids: bool = False,
    ) -> Response:
        """Serve ``prompts`` (text, or token ids) as one-call graphs; a chat's
        ``constraint`` (tools, response format) constrains the sampling and shapes the reply.
        ``with_ids``: every choice and stream chunk lists its generated token ids
        (``token_ids``), and its prompt's (``prompt_token_ids``) as vLLM's
        ``return_token_ids`` does: a chat on its response (or its first chunk), a completion
        on each choice (or the first chunk's)."""
        self._check_model(body.model)
        constraint = constraint or ChatConstraint()
        sampling = to_sampling(body, None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS)
        sampling = with_constraint(sampling, constraint)
        await self._check_constraint(sampling)
        # a chat's rendered prompt takes no added special tokens, as vLLM's chat endpoint
        tokens = [await self._tokenize(prompt, not chat) for prompt in prompts]
        if self.closed:  # the server closed while the prompts were tokenized
            raise ApiError(503, SHUTTING_DOWN)
        # each prompt's ids, as the engine is given them (a chat's: the rendered prompt's),
        # only when asked, as vLLM's (a token-id prompt's generated ids come back unasked)
        prompt_ids = [list(t.token_ids) for t in tokens] if body.return_token_ids else None
        base = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(8)}"
        job = self._submit(
            base,
            tenant,
            prompts,
            tokens,
            sampling,
            stream=body.stream,
            priority=body.priority,
            interval=body.stream_interval or 1,
        )
        if body.stream:
            name = self._name(body.model)
            stream = self._stream(
                job,
                base,
                name,
                chat,
                body.include_usage,
                constraint,
                with_ids=with_ids,
                prompt_ids=prompt_ids[0] if prompt_ids else None,
            )
            return self._count(request, StreamingResponse(stream, media_type="text/event-stream"))
        try:
            results = await self._wait(request, job)
        finally:
            await self._finish(job)
        if results is None:  # the client left: nobody to answer
            return Response(status_code=499)
        failed = next((v for v in results if v.state is VarState.FAILED), None)
        if failed is not None:
            return self._error(request, _var_error(failed))
        response = completion_response(base, self._name(body.model), chat, results, constraint)
        if with_ids:
            for choice, ids in zip(response["choices"], job.token_ids, strict=True):
                choice["token_ids"] = ids
        if prompt_ids is not None:
            if chat:
                response["prompt_token_ids"] = prompt_ids[0]
            else:
                for choice, ids in zip(response["choices"], prompt_ids, strict=True):
                    choice["prompt_token_ids"] = ids
        return self._count(request, JSONResponse(response))

    async def _tokenize(self, prompt: PromptInput, add_special_tokens: bool) -> Prompt:
        """The ids the engine will get for ``prompt``: a token-id prompt's own, a text's
        tokenized once, here, off the event loop when it is long (prompt_tokenizer.py)."""
        if isinstance(prompt, str):
            tokenize = self.ctx.scheduler.prompt_tokenizer.tokenize_prompt
            return await tokenize((prompt,), add_special_tokens)
        return Prompt.of_ids(prompt)

    def _submit(
        self,
        base: str,
        tenant: str | None,
        prompts: Sequence[PromptInput],
        tokens: Sequence[Prompt],
        sampling: SamplingParams,
        *,
        stream: bool,
        priority: int = 0,
        interval: int = 1,
    ) -> _Job:
        """Open the request's app and graph, one call per prompt, and activate every output
        with the criteria ``latency`` and the request's ``priority`` (mutates the scheduler).
        Every prompt's ids (``tokens``) go beside the graph (``AppState.token_prompts``) and
        reach the engine unchanged, so nothing tokenizes a prompt again; a token-id prompt's
        call has no text. ApiError(400) when the graph is refused (too long a prompt, too many
        calls). ``interval``: a stream's tokens per chunk, which the engine may batch too (a
        whole response reads only the final ids: its calls count as unwatched)."""
        scheduler = self.ctx.scheduler
        handle = AppHandle.open(scheduler, base, tenant)
        app = handle.app
        calls = []
        num_tokens: dict[str, int] = {}  # a text prompt's token count, for the size check
        for i, (prompt, ids) in enumerate(zip(prompts, tokens, strict=True)):
            gen = GenSegment(gen=f"out{i}", sampling=sampling)
            text = [TextSegment(text=prompt)] if isinstance(prompt, str) else []
            calls.append(CallSpec(id=f"c{i}", segments=[*text, gen]))
            app.token_prompts[f"c{i}"] = ids
            if isinstance(prompt, str):
                num_tokens[prompt] = len(ids)
        count = num_tokens.__getitem__  # a call's only text is its prompt
        try:
            staged = stage(app.graph, Submit(calls=calls), self.ctx.config, count)
        except ServerError as exc:
            handle.forget()  # nothing of it ran
            raise ApiError(400, _name_prompts(exc.message), "prompt") from None
        handle.submit(staged)
        job = _Job(handle, [f"out{i}" for i in range(len(prompts))], stream, interval)
        app.on_output = job.on_output  # streamed text and generated ids, per prompt
        app.watch_interval = interval if stream else None
        self.jobs.add(job)
        objective = objective_for_get("latency", None, scheduler.clock(), priority)
        for var_id in job.outputs:
            handle.watch(var_id, job.chunks.put_nowait)  # just added: pending, so watched
            handle.get(var_id, objective)
        return job

    async def _wait(self, request: Request, job: _Job) -> list[Variable] | None:
        """Every output's final variable, or None when the client disconnects first."""
        disconnected = asyncio.ensure_future(_disconnect(request))
        try:
            while job.num_final < len(job.outputs):
                item = asyncio.ensure_future(job.chunks.get())
                await asyncio.wait((item, disconnected), return_when="FIRST_COMPLETED")
                if not item.done():
                    item.cancel()
                    return None
                if isinstance(item.result(), Variable):
                    job.num_final += 1
        finally:
            disconnected.cancel()
        return [job.handle.graph.vars[v] for v in job.outputs]

    async def _stream(
        self,
        job: _Job,
        base: str,
        name: str,
        chat: bool,
        include_usage: bool,
        constraint: ChatConstraint,
        *,
        with_ids: bool = False,
        prompt_ids: list[int] | None = None,
    ) -> AsyncIterator[bytes]:
        """The SSE events of a one-prompt request; ``with_ids``: each chunk lists its new
        token ids, and the first chunk ``prompt_ids`` (a chat's at the top, a completion's
        in its choice, as vLLM's). A disconnect cancels this generator (Starlette), and its
        ``finally`` aborts the request."""
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        deltas = ChatDeltas(constraint)  # content, and a tool_calls delta per complete call

        unsent_prompt_ids = None if chat else prompt_ids  # a completion's first chunk's

        def event(delta: Any, finish: str | None = None, ids: Sequence[int] = ()) -> bytes:
            nonlocal unsent_prompt_ids
            chunk = sse_chunk(base, kind, name, created, delta, finish)
            if with_ids:
                chunk["choices"][0]["token_ids"] = list(ids)
            if unsent_prompt_ids is not None:
                chunk["choices"][0]["prompt_token_ids"] = unsent_prompt_ids
                unsent_prompt_ids = None
            return sse(chunk)

        def chunk_events(chunk: Chunk) -> list[bytes]:
            """The events of one queued chunk of text and ids."""
            _, text, ids = chunk
            pieces = (deltas.feed(text) if chat else [text]) if text else []
            if with_ids:  # every output's ids, even with no text (a partial character)
                pieces = pieces or [{} if chat else ""]
            return [event(piece, ids=ids if n == 0 else ()) for n, piece in enumerate(pieces)]

        def final_events(item: Variable) -> list[bytes]:
            """The events that end the stream: an error, or the finish (and usage)."""
            if item.state is VarState.FAILED:
                return [sse(_var_error(item).body())]
            finish = item.finish_reason
            events = []
            if chat:
                held, finish = deltas.finish(finish)
                events += [event(delta) for delta in held]
            events.append(event({} if chat else "", finish))
            if include_usage:
                usage = usage_of([item])
                events.append(sse(sse_chunk(base, kind, name, created, None, usage=usage)))
            return events

        try:
            if chat:  # the first chunk carries the role, as OpenAI's does
                role = sse_chunk(base, kind, name, created, {"role": "assistant", "content": ""})
                if prompt_ids is not None:
                    role["prompt_token_ids"] = prompt_ids
                yield sse(role)
            while True:
                # every item queued by now goes out in one write: when the engine's stream
                # outruns this task (a busy front), the events of several tokens share one
                # send instead of a syscall each; the bytes are the same
                items = [await job.chunks.get()]
                while not job.chunks.empty():
                    items.append(job.chunks.get_nowait())
                events: list[bytes] = []
                for item in items:
                    if isinstance(item, Variable):  # the last item a stream queues
                        yield b"".join([*events, *final_events(item), b"data: [DONE]\n\n"])
                        return
                    events += chunk_events(item)
                if events:
                    yield b"".join(events)
        finally:
            await self._finish(job)

    async def _finish(self, job: _Job) -> None:
        """Close the request's app: aborts whatever still runs (mutates). Shielded, since it
        often runs because the request was cancelled."""
        self.jobs.discard(job)
        with anyio.CancelScope(shield=True):
            await job.handle.close("client disconnected")

    async def abort_all(self, message: str) -> None:
        """Fail every request in flight with ``message``, and refuse those still being
        tokenized (shutdown) (mutates)."""
        self.closed = True
        for job in list(self.jobs):
            await job.handle.close(message)

    # -- helpers ----------------------------------------------------------------------------

    def _name(self, asked: str | None) -> str:
        """The model name a response carries: the one asked for (already checked to be
        served), else the first served name (pure)."""
        return asked or self.ctx.config.served_model_names[0]

    def _count(self, request: Request, response: Response) -> Response:
        """Count a response for /metrics (mutates) and return it. The path is read from
        the scope: ``request.url`` builds a whole URL object (~35 us a response)."""
        path = request.scope["path"]
        route = path if path.startswith("/v1/") else "other"
        if route not in ("/v1/models", "/v1/completions", "/v1/chat/completions"):
            route = "/v1/unknown"
        self.ctx.metrics.http_responses[(route, str(response.status_code))] += 1
        return response

    def _error(self, request: Request, error: ApiError) -> Response:
        return self._count(request, error.response())


async def _disconnect(request: Request) -> None:
    """Returns when the client disconnects (or the response is complete): once the body is
    read, the server's next receive message is ``http.disconnect``."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _name_prompts(message: str) -> str:
    """A scheduler message about call ``'c3'`` / output ``'out3'`` as one about prompt 3
    (pure): the client never saw those ids."""
    return re.sub(r"'(?:c|out)(\d+)'", r"prompt \1", message)


def _var_error(variable: Variable) -> ApiError:
    """The HTTP error for an output that failed (pure)."""
    code, message = variable.error_code, variable.error_message or "failed"
    if code == "limit_exceeded":
        return ApiError(400, _name_prompts(message), "prompt")
    if code == "bad_request":  # refused by the engine as the request's own mistake
        return ApiError(400, message)
    if code == "cancelled":
        return ApiError(503, message)
    return ApiError(500, f"engine error: {message}")


def completion_constraint(extra: dict[str, Any]) -> ChatConstraint:
    """A completions request's structured output (``response_format``, vLLM's
    ``structured_outputs`` or a ``guided_*`` field), as vLLM's /v1/completions takes it, so
    an Eclectus serves as another Eclectus's engine with constraints (pure). ApiError(400)
    for a malformed one, or for ``tools`` (a chat field)."""
    if extra.get("tools"):
        raise ApiError(400, "tools: only /v1/chat/completions takes tools", "tools")
    try:
        return chat_constraint(extra)
    except ToolRequestError as exc:
        raise ApiError(400, str(exc), exc.param) from None
