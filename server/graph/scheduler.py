"""The global scheduler: ready calls of every session -> engine requests, in priority order.

Algorithm. Each session's graph hands over calls whose inputs are ready (QUEUED). The
scheduler keeps them in one ready queue across sessions (ready_queue.py) and, whenever a
slot frees or work arrives, dispatches the best ones while the engine has room for them
(admission.py: its batch and ``max_inflight``; the KV cache is reserved per request before
it is sent). "Best" is objectives.rank_key: urgent (latency/deadline) before throughput,
latency then earliest deadline, then the program-level policy's term (policies.py: app-FIFO
with aging, least attained service, or deadlines), then group. A later get that strengthens
a queued call's objective re-ranks it.
A call that belongs to a task group takes its ready group siblings along, as many as there
are free slots: they go out in the same pass with the same priority, and the rest follow as
slots free (they rank next). Each dispatched call runs as one asyncio task that sends one engine
request per output (multi-output templates are generated in order, each prompt including the
text generated before it), and hands finished outputs back to the graph, which may wake more
calls. Engine batching does the rest.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

from eclectus.protocol import Usage
from eclectus.server.backend import Backend, EngineError, EngineOutput, EngineRequest
from eclectus.server.config import ServerConfig
from eclectus.server.errors import ServerError
from eclectus.server.front.metrics import Metrics
from eclectus.server.front.prompt import Front, Prompt
from eclectus.server.front.prompt_tokenizer import PromptTokenizer
from eclectus.server.graph.activation import form_groups, stamp_arrivals
from eclectus.server.graph.admission import Admission
from eclectus.server.graph.graph import Graph, Node
from eclectus.server.graph.objectives import Objective, RankKey, engine_priority, rank_key
from eclectus.server.graph.pins import PinTable
from eclectus.server.graph.policies import (
    attained_service,
    implicit_deadline,
    program_arrival,
    program_term,
    term_offset,
)
from eclectus.server.graph.ready_queue import QueuedCall, ReadyQueue
from eclectus.server.graph.runner import run_call

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class AppState:
    """What the scheduler holds for one session (application)."""

    session_id: str
    graph: Graph
    arrival: float  # when the session began (calls are ranked by their graph's arrival)
    tenant: str | None = None
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # node id -> task
    pins: PinTable = field(default_factory=PinTable)
    closed: bool = False
    # set once close_app has failed every pending variable: a second close (the session's
    # own, racing the server's shutdown) waits for it, so the failures reach the session's
    # outbox before it writes its close frame
    close_done: asyncio.Event = field(default_factory=asyncio.Event)
    # node id -> the exact ids of a call's prompt known before dispatch: /v1 token-id
    # prompts (the call's segments are then only its output), sent as they are so ids that
    # no text round-trips to stay exact; and /v1 text prompts, tokenized once on arrival
    # (off the event loop) instead of again at dispatch
    token_prompts: dict[str, Prompt] = field(default_factory=dict)
    # called with (output var id, engine output) for each engine output of the app's calls,
    # before the graph hears of it: /v1 reads generated ids here (return_token_ids)
    on_output: Callable[[str, EngineOutput], None] | None = None
    # tokens per engine output that ``on_output``'s reader takes for a watched stream (a
    # streamed /v1 request: 1, or its ``stream_interval``); None: it reads only the final
    # ids, so a call no streamer watches gets ``ServerConfig.engine_stream_interval``
    watch_interval: int | None = None
    # the most attained service (tokens computed; policies.py) any finished call of the
    # session's current program had reached: an eager app's calls, which reach the server
    # with no edges between them, are ranked by it
    service: int = 0
    # the session's current program (policies.program_arrival): when its first call was
    # activated, and the last activation or finished call, which keeps it going
    program_arrival: float | None = None
    last_active: float = 0.0


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """A read-only view of one open session at one moment, for reports (``eclectus demo``);
    the scheduler's own state (AppState, the graph) stays its own."""

    session_id: str
    tenant: str | None
    graph_depth: int  # the longest chain of dependent calls in the session's graph


class GraphScheduler:
    """One per server. All methods run on the server's event loop; those that mutate say so."""

    def __init__(
        self,
        backend: Backend,
        config: ServerConfig,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        *,
        front: Front,
    ) -> None:
        self.backend = backend
        self.front = front
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.epoch = clock()
        self.queue = ReadyQueue()
        self.policy = config.policy_params
        # what the policy's program terms are near, subtracted from every engine priority
        self._term_offset = term_offset(self.policy, self.epoch)
        self.admission = Admission(backend, config)
        # dispatched calls' prompts are tokenized here, off the event loop (the runner)
        self.prompt_tokenizer = PromptTokenizer(front)
        self.num_inflight = 0
        self.num_urgent_inflight = 0  # latency/deadline calls among num_inflight
        self._tenant_inflight: Counter[str | None] = Counter()  # num_inflight by tenant
        self._apps: dict[str, AppState] = {}  # the open sessions, by id, in opening order
        self._seq = count()
        # (session id, node id) of recent dispatches, in order: tests and debugging read it;
        # bounded so a long-running server does not grow it forever
        self.dispatch_log: deque[tuple[str, str]] = deque(maxlen=10_000)
        self._unpin_tasks: set[asyncio.Task[None]] = set()  # unpin tasks, held until done

    # -- sessions -------------------------------------------------------------------------

    def open_app(self, session_id: str, tenant: str | None = None) -> AppState:
        """Register a session (mutates)."""
        # an op's output is at most a frame: a value a client could not have sent either
        graph = Graph(self._count_op, max_op_chars=self.config.max_frame_bytes)
        app = AppState(session_id, graph, self.clock(), tenant)
        self._apps[session_id] = app
        return app

    async def close_app(self, app: AppState, message: str = "session closed") -> None:
        """Cancel the session's queued and running work, abort its engine requests, release
        its pins and fail its pending variables with ``message`` (mutates). Other sessions
        are untouched. A close already under way is waited for, not begun again: a second
        caller returns when the first close has finished."""
        if app.closed:
            await app.close_done.wait()
            return
        app.closed = True
        try:
            self.queue.remove(q for q in self.queue if q.app is app)
            tasks = list(app.tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            app.graph.close(message)
            await self._unpin(app.pins.release_all())
            self._apps.pop(app.session_id, None)
            self._pump()
        finally:
            app.close_done.set()

    async def close_all(self, message: str) -> None:
        """:meth:`close_app` every open session, failing their pending work with ``message``
        (mutates)."""
        for app in list(self._apps.values()):
            await self.close_app(app, message)

    def forget_app(self, app: AppState) -> None:
        """Unregister a session none of whose work was queued, as a refused request's
        (mutates); one that may have run needs :meth:`close_app`."""
        assert not app.tasks and app.graph.nodes == {}, "forget_app: the session has work"
        self._apps.pop(app.session_id, None)

    def app(self, session_id: str) -> AppState | None:
        """The open session ``session_id`` or None (pure; the live state, for tests and
        tools that inspect one session)."""
        return self._apps.get(session_id)

    # -- work arriving ----------------------------------------------------------------------

    def activate(self, app: AppState, var_id: str, objective: Objective) -> None:
        """A get on ``var_id``: merge its objective into everything upstream, form task
        groups, activate those nodes and queue the ready ones (mutates)."""
        nodes = app.graph.upstream(var_id)
        now = self.clock()
        arrival = program_arrival(
            self.policy,
            now=now,
            current=app.program_arrival,
            last_active=app.last_active,
            busy=bool(app.tasks),
        )
        if arrival != app.program_arrival:  # a new program: its service starts from none
            app.service = 0
        app.program_arrival = arrival
        app.last_active = now
        stamp_arrivals(app.graph, nodes, app.program_arrival)
        for node in nodes:
            node.objective = (
                objective if node.objective is None else node.objective.merge(objective)
            )
        if objective.urgent:
            form_groups(app.graph, app.session_id, var_id, nodes)
        for node in nodes:  # a stronger objective or a new group re-ranks queued calls
            queued = self.queue.get(app, node)
            if queued is not None:
                # same submission order (seq); an unchanged key needs no new heap entry
                ranked = self._queued(app, node, queued.enqueued_at, seq=queued.key[-1])
                if ranked.key != queued.key:
                    self.queue.push(ranked)
        self.enqueue(app, app.graph.activate(nodes))

    def set_value(self, app: AppState, var_id: str, text: str) -> None:
        """The client sets a variable (mutates); raises GraphError if it may not."""
        self.enqueue(app, app.graph.set_value(var_id, text))

    def cancel(self, app: AppState, var_id: str) -> None:
        """Cancel the producer of ``var_id`` and everything downstream (mutates)."""
        node = app.graph.producer(var_id)
        if node is not None:
            self._drop(app, app.graph.fail(node, "cancelled", f"{var_id!r} was cancelled"))

    def enqueue(self, app: AppState, nodes: list[Node]) -> None:
        """Queue QUEUED calls and dispatch what fits (mutates)."""
        now = self.clock()
        for node in nodes:
            node.service_key = self._attained(app, node)
            self.queue.push(self._queued(app, node, now))
        self._pump()

    def complete(
        self,
        app: AppState,
        node: Node,
        var_id: str,
        text: str,
        usage: Usage | None,
        finish_reason: str | None,
    ) -> None:
        """One output of a running call is final: into the graph, its tokens into the
        session's attained service, and the calls it readies into the queue (mutates)."""
        ready = app.graph.complete_output(node, var_id, text, usage, finish_reason)
        app.service = max(app.service, node.service_key + node.service_tokens)
        app.last_active = self.clock()
        self.enqueue(app, ready)

    @staticmethod
    def _attained(app: AppState, node: Node) -> int:
        """``node``'s program's attained service as it is queued (pure; policies.py)."""
        inputs = [app.graph.vars[v] for v in node.inputs]
        linked = any(v.producer is not None or v.service > 0 for v in inputs)
        return attained_service([v.service for v in inputs], linked, app.service)

    def snapshot(self) -> list[SessionSnapshot]:
        """The open sessions, in the order they opened (pure; copies, so a caller cannot
        reach the live state)."""
        return [
            SessionSnapshot(app.session_id, app.tenant, app.graph.depth())
            for app in self._apps.values()
        ]

    @property
    def ready(self) -> list[QueuedCall]:
        """The queued calls, unordered (pure; for tests and gauges)."""
        return list(self.queue)

    # -- dispatch -------------------------------------------------------------------------

    def _queued(
        self, app: AppState, node: Node, enqueued_at: float, seq: int | None = None
    ) -> QueuedCall:
        arrival = node.arrival if node.arrival is not None else app.arrival
        term = program_term(
            self.policy, arrival=arrival, service_tokens=node.service_key, enqueued_at=enqueued_at
        )
        key: RankKey = rank_key(
            node.objective or Objective(),
            program_term=term,
            group=node.group,
            seq=next(self._seq) if seq is None else seq,
            implicit_deadline=implicit_deadline(self.policy, arrival),
        )
        return QueuedCall(app, node, enqueued_at, key)

    def _pump(self) -> None:
        limit = self.admission.max_inflight()
        while self.num_inflight < limit:
            best = self._next_call()
            if best is None:
                return
            if not _urgent(best) and self._background_full():
                # the best is throughput work, so everything queued is: it waits for the
                # urgent calls in flight to finish (or a background slot to free)
                return
            self.queue.remove([best])
            batch = [best]
            if best.node.group is not None:  # its siblings, as many as there are slots
                room = limit - self.num_inflight - 1
                batch += self.queue.take_group(best.node.group, room)
            priority = engine_priority(best.key, self.epoch, self._term_offset)
            for queued in batch:
                self._dispatch(queued, priority)

    def _next_call(self) -> QueuedCall | None:
        """The call to dispatch next, left queued (pure): the best-ranked, unless its tenant
        holds ``max_inflight_per_tenant`` slots while another tenant's call of the same class
        waits under its share; then that tenant's best. Work-conserving: a tenant over its
        share still gets every slot nobody under theirs is waiting for."""
        best = self.queue.peek_best()
        cap = self.config.max_inflight_per_tenant
        if best is None or cap is None or self._tenant_inflight[best.app.tenant] < cap:
            return best
        full = {tenant for tenant, n in self._tenant_inflight.items() if n >= cap}
        fair = self.queue.peek_best(skip=full)
        if fair is not None and _urgent(fair) == _urgent(best):
            return fair  # latency work still comes before throughput work, whoever's
        return best

    def _dispatch(self, queued: QueuedCall, priority: float) -> None:
        app, node = queued.app, queued.node
        app.graph.start(node)
        self.num_inflight += 1
        self.admission.note_inflight(self.num_inflight)
        self._tenant_inflight[app.tenant] += 1
        urgent = _urgent(queued)
        self.num_urgent_inflight += urgent
        self.dispatch_log.append((app.session_id, node.node_id))
        task = asyncio.get_running_loop().create_task(self._run(app, node, priority, urgent))
        app.tasks[node.node_id] = task
        # the slot is freed by a done callback, not by a finally in _run: a task cancelled
        # before its first step (dispatched and cancelled in one turn of the loop) never
        # runs a line of its coroutine, so a finally there would leak the slot for good
        task.add_done_callback(functools.partial(self._ended, app, node.node_id, urgent))

    def _background_full(self) -> bool:
        """While urgent calls are in flight, throughput calls may hold at most
        ``max_background_inflight`` engine slots (pure)."""
        if self.num_urgent_inflight == 0:
            return False
        background = self.num_inflight - self.num_urgent_inflight
        return background >= self.config.max_background_inflight

    async def _run(self, app: AppState, node: Node, priority: float, urgent: bool) -> None:
        try:
            await run_call(self, app, node, priority, background=not urgent)
        except EngineError as exc:
            self.metrics.calls_failed += 1
            self._drop(app, app.graph.fail(node, exc.code, str(exc) or "engine error"))
        except ServerError as exc:  # e.g. the resolved prompt is over max_prompt_tokens
            self.metrics.calls_failed += 1
            self._drop(app, app.graph.fail(node, exc.code, exc.message))
        except Exception as exc:  # a bug must fail the call, never the server
            log.exception("call %s/%s failed", app.session_id, node.node_id)
            self.metrics.calls_failed += 1
            self._drop(app, app.graph.fail(node, "internal", f"internal error: {exc}"))

    def _ended(self, app: AppState, node_id: str, urgent: bool, task: asyncio.Task[None]) -> None:
        """A dispatched call's task is done, however it ended (started or not): free its slot
        and dispatch what fits (mutates)."""
        if task.cancelled():
            self.metrics.calls_cancelled += 1
        self.num_inflight -= 1
        self.admission.note_inflight(self.num_inflight)
        self._tenant_inflight[app.tenant] -= 1
        if not self._tenant_inflight[app.tenant]:
            del self._tenant_inflight[app.tenant]
        if urgent:
            self.num_urgent_inflight -= 1
        if app.tasks.get(node_id) is task:
            del app.tasks[node_id]
        if not app.closed:
            self._pump()

    def request(
        self, app: AppState, node: Node, index: int, prompt: Prompt, **kwargs: object
    ) -> EngineRequest:
        """Build the engine request for output ``index`` of ``node`` with ``prompt``'s ids
        (mutates the pin table for a call's first request)."""
        request_id = f"{app.session_id}/{node.node_id}/{index}"
        pin = 0
        if index == 0:
            pin, release = app.pins.on_dispatch(app.graph, node, request_id)
            self._spawn_unpin(release)
        return EngineRequest(
            request_id=request_id,
            prompt_token_ids=prompt.token_ids,
            prefix_ends=prompt.prefix_ends,
            tenant=app.tenant,
            pin_prefix_tokens=prompt.prefix_tokens(pin),
            stream_interval=self._stream_interval(app, node.outputs[index]),
            **kwargs,  # type: ignore[arg-type]
        )

    def _stream_interval(self, app: AppState, var_id: str) -> int:
        """Tokens the engine may batch into one output for ``var_id`` (pure): 1 while a
        streaming get watches it, the /v1 stream's own interval for a streamed /v1 request,
        else ``engine_stream_interval``. Decided at dispatch: a streaming get that arrives
        later still gets the text from then on, in coarser chunks, and then the value."""
        if app.graph.vars[var_id].streamers:
            return 1
        if app.watch_interval is not None:
            return app.watch_interval
        return self.config.engine_stream_interval

    # -- helpers --------------------------------------------------------------------------

    def _drop(self, app: AppState, nodes: list[Node]) -> None:
        """Failed nodes leave the ready list; running ones are cancelled (mutates)."""
        ids = {n.node_id for n in nodes}
        self.queue.remove(q for n in nodes if (q := self.queue.get(app, n)) is not None)
        current = asyncio.current_task()
        for node_id in ids:
            task = app.tasks.get(node_id)
            if task is not None and task is not current:
                task.cancel()
        self._spawn_unpin(app.pins.forget(ids))

    def _spawn_unpin(self, request_ids: list[str]) -> None:
        """Unpin in the background (mutates). The task is held in ``_unpin_tasks`` until it
        ends: the loop keeps only a weak reference, so an unheld task may vanish unrun."""
        if request_ids:
            task = asyncio.get_running_loop().create_task(self._unpin(request_ids))
            self._unpin_tasks.add(task)
            task.add_done_callback(self._unpin_tasks.discard)

    async def _unpin(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            try:
                await self.backend.unpin(request_id)
            except Exception:  # an unpin failure only costs cache space
                log.exception("unpin %s failed", request_id)

    def _count_op(self) -> None:
        self.metrics.ops_run += 1

    def gauges(self) -> dict[str, float]:
        """GraphScheduler gauges for /metrics (pure)."""
        knee = self.admission.knee.fit() if self.admission.knee is not None else None
        fit = {}
        if knee is not None:
            fit = {
                "step_fixed_seconds": knee.t0,
                "step_per_seq_seconds": knee.c,
                "step_per_prefill_token_seconds": knee.p,
            }
        return {
            **fit,
            "queue_depth": len(self.queue),
            "inflight": self.num_inflight,
            "admitted_limit": self.admission.max_inflight(),
            "kv_reserved_tokens": self.admission.num_reserved_tokens,
            "kv_admission_waits": self.admission.num_kv_waits,
            "pinned_prefixes": sum(len(app.pins.pins) for app in self._apps.values()),
        }


def _urgent(queued: QueuedCall) -> bool:
    """Whether a queued call is latency/deadline work (its rank key's class) (pure)."""
    return queued.key[0] == 0
