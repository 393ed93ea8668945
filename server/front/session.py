"""One WebSocket connection's frame loop: parse, authenticate, apply, answer.

Frames are handled one at a time in arrival order. Answers go through an outbox queue drained
by a writer task, so synchronous graph callbacks (a value is final, a delta streamed) can
answer without awaiting, and deltas always precede their value. Every failure of a frame
becomes an error frame; only a failed authentication (or a session limit) closes the socket.
A connection that sends no hello within ``handshake_timeout_s``, or a session with nothing in
flight that sends nothing for ``idle_timeout_s``, is closed.

No client can hurt another through its session: a big frame is validated in slices and a big
submit staged on a worker thread, tokens are counted on a worker thread and a submit's gets
yield between them; a session waits on at most ``max_pending_gets_per_session`` gets; its
outbox holds at most ``max_outbox_bytes``, and a client that reads slower than that is
disconnected (1008, the reason says why); a malformed frame (deep nesting, lone surrogates)
is a ``bad_request``, never a logged traceback (decode.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import dataclass, field

from pydantic import BaseModel

from eclectus import __version__
from eclectus.protocol import (
    PROTOCOL_VERSION,
    Ack,
    Cancel,
    Close,
    Delta,
    Error,
    ErrorCode,
    GenSegment,
    Get,
    GetSpec,
    Hello,
    Limits,
    ModelCard,
    Release,
    Set,
    Submit,
    Tokenize,
    Tokens,
    Value,
    Welcome,
)
from eclectus.server.backend import Backend, RequestRefused, check_constraint
from eclectus.server.config import ServerConfig
from eclectus.server.errors import LimitError, ServerError
from eclectus.server.front.app_handle import AppHandle
from eclectus.server.front.auth import Authenticator, AuthFailure
from eclectus.server.front.decode import (
    check_surrogates,
    decode,
    echoable_id,
    validate,
    validate_in_slices,
)
from eclectus.server.front.metrics import Metrics
from eclectus.server.front.prompt import Front
from eclectus.server.front.transport import Disconnected, Transport
from eclectus.server.graph.fragment import (
    KnownPrompt,
    Staged,
    build,
    check_prompt_sizes,
    check_still_applies,
    known_prompts,
    staged_prompts,
    texts_to_count,
)
from eclectus.server.graph.graph import Graph, Variable, VarState
from eclectus.server.graph.objectives import objective_for_get
from eclectus.server.graph.release import release
from eclectus.server.graph.scheduler import GraphScheduler

log = logging.getLogger(__name__)
_POLICY_VIOLATION = 1008  # WebSocket close code for a failed authentication or a slow reader
_WRITE_BURST = 32  # frames the writer sends before letting other tasks run
# frames above this size are validated in slices; submits with more items than this are
# staged on a worker thread (pure Python: the GIL hands the loop its turn every few ms)
_INLINE_FRAME_CHARS = 64 << 10
_INLINE_SUBMIT_ITEMS = 256
_GOING_AWAY = 1001  # idle, or the server is shutting down


@dataclass(slots=True)
class ServerContext:
    """What every session shares: one per server."""

    config: ServerConfig
    backend: Backend
    scheduler: GraphScheduler
    metrics: Metrics
    auth: Authenticator
    front: Front  # the tokenizer and chat template: prompts become ids there, once
    model: ModelCard  # the served model as clients see it (the front's card)
    sessions: set[Session] = field(default_factory=set)
    draining: bool = False  # shutting down: no new sessions or requests

    def sessions_of(self, tenant: str | None) -> int:
        """Open sessions of ``tenant`` (pure)."""
        return sum(1 for s in self.sessions if s.handle is not None and s.handle.tenant == tenant)


class Session:
    """One client session. ``run`` owns the connection until it closes."""

    def __init__(self, ws: Transport, ctx: ServerContext, address: str = "unknown") -> None:
        self.ws = ws
        self.ctx = ctx
        self.address = address  # the client's IP address (auth failures are limited per one)
        self.handle: AppHandle | None = None  # its app in the scheduler, from hello on
        self.outbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.close_code: int | None = None  # set: stop reading and close with this code
        self.close_reason = ""
        self.num_waiting = 0  # gets not answered yet: while > 0 the session is not idle
        self.last_active = 0.0  # loop time of the last frame or answer
        self.stopping = asyncio.Event()  # set by shut(): the server is closing
        self.shut_message = "session closed"
        self._recv: asyncio.Future[str | bytes] | None = None
        self.outbox_bytes = 0  # queued and not yet written (bounded by max_outbox_bytes)
        self._cut_off = False  # the client read too slowly: the session is ending
        self._logged_internal = False  # a handler bug's traceback was logged once already

    async def run(self, first: str | None = None) -> None:
        """Serve frames until the client leaves or a deadline passes, then release
        everything (mutates). ``first``: a frame that came with the upgrade request (the
        hello header), handled before any the socket brings."""
        loop = asyncio.get_running_loop()
        writer = loop.create_task(self._write())
        stop = loop.create_task(self.stopping.wait())
        self.last_active = loop.time()
        try:
            if first is not None:
                await self._on_message(first)
            while self.close_code is None:
                message = await self._next_message(loop, stop)
                if message is None:
                    break
                self.last_active = loop.time()
                await self._on_message(message)
        except Disconnected:
            pass
        finally:
            stop.cancel()
            if self._recv is not None:
                self._recv.cancel()
            await self._release()
            if self._cut_off:  # its writer waits on a socket the client does not read
                writer.cancel()
            self.outbox.put_nowait(None)
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            # a close frame waits on that socket too: bounded, then the app lets go of it
            with contextlib.suppress(TimeoutError):
                close = self.ws.close(self.close_code or 1000, self.close_reason)
                await asyncio.wait_for(close, self.ctx.config.close_timeout_s)

    async def _next_message(
        self, loop: asyncio.AbstractEventLoop, stop: asyncio.Task[bool]
    ) -> str | bytes | None:
        """The next frame, or None when a deadline passed or ``stop`` finished (mutates: sets
        the close code). Before hello the deadline is the handshake's; after, the idle one,
        which only runs while no get is waiting for an answer."""
        config = self.ctx.config
        while True:
            timeout = config.handshake_timeout_s if self.handle is None else config.idle_timeout_s
            if self._recv is None:
                self._recv = loop.create_task(self.ws.recv())
            remaining = max(self.last_active + timeout - loop.time(), 0.0)
            await asyncio.wait(
                (self._recv, stop), timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if self._recv.done():
                received, self._recv = self._recv, None
                return received.result()  # Disconnected propagates
            if stop.done():
                if self.close_code is None:  # set already when a slow reader is cut off
                    self.close_code, self.close_reason = _GOING_AWAY, self.shut_message
                return None
            if self.handle is not None and self.num_waiting > 0:
                self.last_active = loop.time()  # busy: the idle clock starts afresh
                continue
            if loop.time() < self.last_active + timeout:
                continue  # an answer moved last_active while we waited
            kind = "hello" if self.handle is None else "idle"
            self.ctx.metrics.timeouts[kind] += 1
            reason = "no hello in time" if self.handle is None else "idle session"
            self.close_code, self.close_reason = _GOING_AWAY, reason
            return None

    # -- frame handling -------------------------------------------------------------------

    async def _on_message(self, message: str | bytes) -> None:
        self.ctx.metrics.client_frames += 1
        frame_id = None
        try:
            raw = decode(message, self.ctx.config.max_frame_bytes)
            frame_id = echoable_id(raw)
            check_surrogates(message, raw)
            if len(message) > _INLINE_FRAME_CHARS:  # validated in slices, yielding between
                frame = await validate_in_slices(raw)
            else:
                frame = validate(raw)
            await self._handle(frame)
        except ServerError as exc:
            self.ctx.metrics.rejected_frames[exc.code] += 1
            self.send(
                Error(id=frame_id, code=exc.code, message=exc.message, field=exc.field, var=exc.var)
            )
            if self.handle is None and self.ctx.config.auth_required:
                self.close_code = _POLICY_VIOLATION  # with auth on, only a valid hello opens
        except Exception as exc:  # a handler bug must not end the session or the server
            # one traceback per session, then one line each: a client that found a bug
            # must not be able to flood the log with it
            log.error("frame handler failed: %r", exc, exc_info=not self._logged_internal)
            self._logged_internal = True
            self.send(Error(id=frame_id, code="internal", message=f"internal error: {exc}"))

    async def _handle(self, frame: BaseModel) -> None:
        """Apply one valid frame (mutates the session, its graph and the scheduler)."""
        if isinstance(frame, Hello):
            self._hello(frame)
        elif self.handle is None:
            if not self.ctx.config.auth_required:
                raise ServerError("bad_request", "send hello first", field="type")
            frame_id = getattr(frame, "id", None)
            self._refuse(frame_id, "unauthorized", "authenticate with hello first", "type")
        elif isinstance(frame, Submit):
            await self._submit(frame)
        elif isinstance(frame, Get):
            self._get(frame, frame.id)
        elif isinstance(frame, Set):
            self.handle.set_value(frame.var, frame.value)
            self.send(Ack(id=frame.id))
        elif isinstance(frame, Cancel):
            self.handle.graph.var(frame.var)
            self.handle.cancel(frame.var)
            self.send(Ack(id=frame.id))
        elif isinstance(frame, Release):
            release(self.handle.graph, frame.vars)
            self.send(Ack(id=frame.id))
        elif isinstance(frame, Tokenize):
            self.ctx.config.check_model(frame.model, "model")
            # a long text is encoded on the prompt tokenizer's worker: the loop keeps serving
            tokenize = self.ctx.scheduler.prompt_tokenizer.tokenize_prompt
            ids = list((await tokenize((frame.text,), False)).token_ids)
            if self.handle is None:  # the client left while the text was encoded
                return
            self.send(Tokens(id=frame.id, count=len(ids), ids=ids))
        elif isinstance(frame, Close):
            self.send(Ack(id=frame.id))
            self.close_code = 1000

    def _hello(self, frame: Hello) -> None:
        config = self.ctx.config
        if self.handle is not None:
            raise ServerError("bad_request", "hello was already sent", field="type")
        try:
            tenant = self.ctx.auth.authenticate(frame.token, self.address).tenant
        except AuthFailure as exc:
            self._refuse(frame.id, "unauthorized", str(exc), "token")
            return
        if tenant is not None and frame.tenant not in (None, tenant):
            # the tenant is who the token says; a different claim is a client mistake
            message = f"tenant {frame.tenant!r} does not match the token's tenant"
            self._refuse(frame.id, "unauthorized", message, "tenant")
            return
        if self.ctx.draining:
            self._refuse(frame.id, "limit_exceeded", "the server is shutting down", None)
            return
        if frame.protocol != PROTOCOL_VERSION:
            raise ServerError(
                "protocol_version",
                f"server speaks protocol {PROTOCOL_VERSION}, not {frame.protocol}",
                field="protocol",
            )
        if len(self.ctx.sessions) >= config.max_sessions:
            self._refuse(frame.id, "limit_exceeded", f"{config.max_sessions} sessions open", None)
            return
        if tenant is not None and self.ctx.sessions_of(tenant) >= config.max_sessions_per_tenant:
            message = f"{config.max_sessions_per_tenant} sessions of this tenant open"
            self._refuse(frame.id, "limit_exceeded", message, None)
            return
        session_id = secrets.token_hex(8)
        self.handle = AppHandle.open(self.ctx.scheduler, session_id, tenant)
        self.ctx.sessions.add(self)
        self.ctx.metrics.sessions = len(self.ctx.sessions)
        self.ctx.metrics.sessions_total += 1
        log.info("session %s opened (app %r, tenant %r)", session_id, frame.app, tenant)
        # the call syntax /v1 uses too: --tool-call-parser, else the template's
        card = self.ctx.model.with_tool_call_format(config.tool_call_parser)
        self.send(
            Welcome(
                id=frame.id,
                session=session_id,
                server_version=__version__,
                models=[card.named(name) for name in config.served_model_names],
                # every limit the protocol announces is the config's field of its name
                limits=Limits(**{name: getattr(config, name) for name in Limits.model_fields}),
            )
        )

    async def _submit(self, frame: Submit) -> None:
        """Stage, size-check and add a fragment, then run its gets (mutates). A big fragment
        is staged and its tokens counted on a worker thread, and the gets yield between
        them, so a submit costs other sessions a few ms of event loop at a time."""
        assert self.handle is not None
        graph, config = self.handle.graph, self.ctx.config
        limit = config.max_prompt_tokens
        if len(frame.vars) + len(frame.calls) + len(frame.ops) > _INLINE_SUBMIT_ITEMS:
            staged, prompts, counts = await asyncio.to_thread(self._stage, graph, frame)
        else:
            staged = build(graph, frame, config)
            prompts = known_prompts(staged, graph)
            todo = texts_to_count(prompts, limit)
            counts = await asyncio.to_thread(self._count_tokens, todo) if todo else {}
        check_prompt_sizes(prompts, lambda text, first: counts[text, first], limit)
        await self._check_constraints(staged)
        if self.handle is None:  # the client left while we were away
            return
        check_still_applies(graph, staged, frame)
        self.handle.submit(staged)
        self.send(Ack(id=frame.id))
        for i, spec in enumerate(frame.gets):
            if i:
                await asyncio.sleep(0)  # each get walks the graph: let others run between
            if self.handle is None:
                return
            self._get(spec, frame.id)

    async def _check_constraints(self, staged: Staged) -> None:
        """ServerError ``bad_request`` naming the output whose structured outputs the engine
        cannot serve (a constraint it does not compile, a max_tokens too small for any valid
        output), before any of the fragment runs. Compiles on a worker thread (cached)."""
        for segments, where in staged_prompts(staged):
            constrained = [
                s
                for s in segments
                if isinstance(s, GenSegment) and s.sampling.structured_outputs is not None
            ]
            for segment in constrained:  # free outputs (most) cost no thread hop
                try:
                    await asyncio.to_thread(check_constraint, self.ctx.backend, segment.sampling)
                except RequestRefused as exc:
                    raise ServerError(
                        "bad_request",
                        f"output {segment.gen!r}: {exc}",
                        field=f"{where}.sampling.structured_outputs",
                    ) from None

    def _stage(
        self, graph: Graph, frame: Submit
    ) -> tuple[Staged, list[KnownPrompt], dict[tuple[str, bool], int]]:
        """:func:`build` and the token counts of its known prompts (pure: reads ``graph``,
        which the loop may change meanwhile only by deleting released variables, and
        :func:`check_still_applies` runs after)."""
        staged = build(graph, frame, self.ctx.config)
        prompts = known_prompts(staged, graph)
        counts = self._count_tokens(texts_to_count(prompts, self.ctx.config.max_prompt_tokens))
        return staged, prompts, counts

    def _count_tokens(self, texts: set[tuple[str, bool]]) -> dict[tuple[str, bool], int]:
        """Tokens of each (flat prompt text, add_special_tokens) as the front tokenizes it
        (pure; any thread: the tokenizer is immutable)."""
        front = self.ctx.front
        return {(text, special): len(front.encode((text,), special)) for text, special in texts}

    def _get(self, spec: Get | GetSpec, frame_id: str | None) -> None:
        """Watch the variable, answer when it is final, and activate its upstream."""
        handle = self.handle
        assert handle is not None
        variable = handle.graph.var(spec.var)
        loop = asyncio.get_running_loop()
        started = loop.time()
        limit = self.ctx.config.max_pending_gets_per_session
        if variable.state is VarState.PENDING and self.num_waiting >= limit:
            raise LimitError(
                f"{self.num_waiting} gets already wait on unfinished variables, limit {limit}",
                field="var",
                var=spec.var,
            )

        def answer(var: Variable) -> None:
            if var.state is VarState.READY:
                self.ctx.metrics.observe_get(spec.criteria, loop.time() - started)
                self.send(
                    Value(
                        id=frame_id,
                        var=var.var_id,
                        text=var.value or "",
                        usage=var.usage,
                        finish_reason=var.finish_reason,
                    )
                )
            else:
                self.send(
                    Error(
                        id=frame_id,
                        code=var.error_code or "engine_error",
                        message=var.error_message or "failed",
                        var=var.var_id,
                    )
                )

        def answer_waiting(var: Variable) -> None:
            self.num_waiting -= 1
            self.last_active = loop.time()
            answer(var)

        def delta(text: str) -> None:
            self.send(Delta(id=frame_id, var=spec.var, text=text))

        if not handle.watch(spec.var, answer_waiting, delta if spec.stream else None):
            if spec.stream and variable.state is VarState.READY:
                delta(variable.value or "")
            answer(variable)  # final already
            return
        self.num_waiting += 1
        objective = objective_for_get(spec.criteria, spec.deadline_ms, self.ctx.scheduler.clock())
        handle.get(spec.var, objective)

    # -- output and teardown --------------------------------------------------------------

    def send(self, frame: BaseModel) -> None:
        """Queue a frame for the writer (mutates: counts it). Past ``max_outbox_bytes`` of
        unwritten frames the client is not keeping up: frames are dropped from then on and
        the connection closes with 1008 and a reason saying so."""
        if self._cut_off:
            return
        kind = getattr(frame, "type", "")
        metrics = self.ctx.metrics
        if kind == "value":
            metrics.values_sent += 1
        elif kind == "delta":
            metrics.deltas_sent += 1
        elif kind == "error":
            metrics.errors_sent += 1
        text = frame.model_dump_json(exclude_none=True)
        limit = self.ctx.config.max_outbox_bytes
        if self.outbox_bytes + len(text) > limit:
            self._disconnect(f"client reads too slowly: over {limit} bytes of frames unread")
            return
        self.outbox_bytes += len(text)
        self.outbox.put_nowait(text)

    def _disconnect(self, reason: str) -> None:
        """End the session from a synchronous callback: stop reading, release it and close
        with 1008 and ``reason`` (mutates; once)."""
        session_id = self.handle.session_id if self.handle else "-"
        log.info("session %s disconnected: %s", session_id, reason)
        self._cut_off = True
        self.close_code, self.close_reason = _POLICY_VIOLATION, reason
        self.shut_message = reason  # what its pending gets fail with
        self.stopping.set()

    def _refuse(
        self, frame_id: str | None, code: ErrorCode, message: str, field_name: str | None
    ) -> None:
        """Answer with an error, then close the socket (mutates)."""
        self.ctx.metrics.rejected_frames[code] += 1
        self.send(Error(id=frame_id, code=code, message=message, field=field_name))
        self.close_code = _POLICY_VIOLATION

    async def _write(self) -> None:
        num_sent = 0
        while (text := await self.outbox.get()) is not None:
            self.outbox_bytes -= len(text)
            num_sent += 1
            if num_sent % _WRITE_BURST == 0:  # a send to a fast socket never yields
                await asyncio.sleep(0)
            try:
                await self.ws.send(text)
            except Disconnected:
                return

    def shut(self, message: str) -> None:
        """End the session from outside (shutdown): stop reading, fail its pending gets with
        ``message`` and close with 1001 once every answer is sent (mutates)."""
        self.shut_message = message
        self.stopping.set()

    async def _release(self) -> None:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            await handle.close(self.shut_message)
            log.info("session %s closed", handle.session_id)
        self.ctx.sessions.discard(self)
        self.ctx.metrics.sessions = len(self.ctx.sessions)
