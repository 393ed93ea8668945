"""The engines behind one server: their health, load and prefix knowledge, and routing.

Health. An engine starts healthy once its handshake passes. Any EngineDown (refused
connection, timeout, 5xx, a dropped stream, a failed /metrics scrape) marks it down: its
prefix knowledge and pins are forgotten (its cache may be gone) and nothing is routed to it.
A background task re-runs the handshake on down engines every ``probe_interval_s`` (a
restarted engine must still have our tokenizer) and returns them to the pool; on healthy
ones it scrapes ``/metrics`` for load. A request's failed stream (``stream_failed``) also
probes its engine at once, one probe per engine at a time: an engine that is alive (a reset
connection, one proxy hiccup) is back after one handshake, not a probe interval later.
While no engine is healthy, ``acquire`` waits up to ``max_down_wait_s`` for one to return
before giving up.

Routing state per engine: our requests in flight on it, the prefixes it holds, the
prefixes pinned there and the task groups running there; the choice itself is
:func:`routing.route`, a pure function of :meth:`EnginePool.views`. What an engine holds
comes from its own KV events where it publishes them (kv_subscriber.py: the blocks its
cache really holds, whoever sent the prompts, plus the prefixes of our requests in flight
there, which it is computing now); otherwise, or while its event stream is not live, from
the prediction (prefix_index.py: every prefix this front placed there, LRU).

Background beside foreground (preemption.py): per engine, the foreground attempts in flight
and the background ones running; while foreground runs there, a background attempt is not
placed beyond ``max_background_per_engine`` and those beyond it are paused (their
``Placement.pause`` is set: the backend closes their streams at once and continues them
later).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count

from eclectus.server.backend import EngineRequest
from eclectus.server.front.prompt import Prompt
from eclectus.server.remote.errors import EngineDown, EngineRejected, RemoteStartError
from eclectus.server.remote.kv_index import chain_keys
from eclectus.server.remote.kv_subscriber import KVEventSubscriber
from eclectus.server.remote.load import EngineLoad
from eclectus.server.remote.members import Member
from eclectus.server.remote.preemption import BackgroundAttempt, admits_background, to_preempt
from eclectus.server.remote.prefix_index import PrefixIndex, PrefixKey, prefix_keys
from eclectus.server.remote.routing import (
    Decision,
    EngineView,
    RoutingParams,
    RoutingPolicy,
    route,
)

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class PoolEngine:
    """One member and what the pool knows about it."""

    index: int
    member: Member
    max_inflight: int
    healthy: bool = False
    window: int | None = None  # its context window, once probed
    num_inflight: int = 0
    load: EngineLoad = field(default_factory=EngineLoad)
    prefixes: PrefixIndex = field(default_factory=PrefixIndex)
    pins: dict[str, tuple[PrefixKey, ...]] = field(default_factory=dict)  # request id -> keys
    groups: Counter[str] = field(default_factory=Counter)  # group -> requests in flight
    events: KVEventSubscriber | None = None  # its KV events, where it publishes them
    placed: dict[str, tuple[PrefixKey, ...]] = field(default_factory=dict)  # in flight here
    num_foreground: int = 0  # latency/deadline attempts in flight
    background: dict[str, BackgroundAttempt] = field(default_factory=dict)  # by request id
    pauses: dict[str, asyncio.Event] = field(default_factory=dict)  # by background request id
    num_preemptions: int = 0
    down_reason: str | None = None
    num_requests: int = 0
    num_failures: int = 0

    def pinned_match(self, keys: tuple[PrefixKey, ...]) -> int:
        """Tokens of the longest of ``keys`` pinned here (pure)."""
        wanted = {k.key for k in keys}
        return max(
            (k.num_tokens for pinned in self.pins.values() for k in pinned if k.key in wanted),
            default=0,
        )

    def match(self, keys: tuple[PrefixKey, ...], chains: dict[int, list[int]]) -> int:
        """Tokens of this prompt the engine holds or is computing (pure but for filling
        ``chains``, the prompt's block keys by block size): from its events when they are
        live, else the prediction."""
        if self.events is None or not self.events.live:
            return self.prefixes.match(keys)
        index = self.events.index
        wanted = {k.key for k in keys}
        inflight = max(
            (k.num_tokens for placed in self.placed.values() for k in placed if k.key in wanted),
            default=0,
        )
        if index.block_size is None:
            return inflight
        return max(index.match(chains[index.block_size]), inflight)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request's attempt runs and what the pool recorded for it (to undo)."""

    engine: PoolEngine
    decision: Decision
    request_id: str
    group: str | None
    pause: asyncio.Event | None = None  # a background attempt's: set when the pool pauses it

    @property
    def preempted(self) -> bool:
        """Whether the pool has paused this background attempt (pure): its stream should
        stop and the request continue later."""
        return self.pause is not None and self.pause.is_set()


class EnginePool:
    """Routes attempts to members. All methods run on the server's event loop."""

    def __init__(
        self,
        members: list[Member],
        *,
        policy: RoutingPolicy = RoutingPolicy.GRAPH,
        params: RoutingParams | None = None,
        max_inflight_per_engine: int = 256,
        max_background_per_engine: int | None = 1,
        probe_interval_s: float = 2.0,
        max_down_wait_s: float = 0.0,
        events: list[KVEventSubscriber | None] | None = None,
    ) -> None:
        self.engines = [PoolEngine(i, m, max_inflight_per_engine) for i, m in enumerate(members)]
        for engine, subscriber in zip(self.engines, events or [], strict=False):
            engine.events = subscriber
        self.max_background = max_background_per_engine  # beside foreground; None: no cap
        self._seq = count()
        self.policy = policy
        self.params = params or RoutingParams()
        self.probe_interval_s = probe_interval_s
        self.max_down_wait_s = max_down_wait_s  # acquire's wait while no engine is healthy
        self.window: int | None = None  # the smallest context window of all engines
        self.decisions: Counter[str] = Counter()  # reason -> count (metrics, tests)
        self._last_index = -1
        self._changed = asyncio.Event()  # set when a slot frees or an engine returns
        self._prober: asyncio.Task[None] | None = None
        self._probes: dict[int, asyncio.Task[None]] = {}  # engine index -> its probe running

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Probe every engine at once, then keep probing in the background (mutates).
        RemoteStartError when an engine must not be used or none can be reached."""
        for engine in self.engines:
            if engine.events is not None:
                engine.events.start()
        results = await asyncio.gather(
            *(self._probe(e) for e in self.engines), return_exceptions=True
        )
        for engine, result in zip(self.engines, results, strict=True):
            if isinstance(result, RemoteStartError):
                raise result
            if isinstance(result, BaseException) and not isinstance(result, EngineDown):
                raise result
            if isinstance(result, EngineDown):
                self.mark_down(engine, str(result))
        if not any(e.healthy for e in self.engines):
            reasons = "; ".join(f"{e.member.name}: {e.down_reason}" for e in self.engines)
            raise RemoteStartError(f"no engine can be reached ({reasons})")
        self._prober = asyncio.get_running_loop().create_task(self._probe_forever())

    async def close(self) -> None:
        """Stop probing and close every member (mutates; idempotent)."""
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
            self._prober = None
        probes, self._probes = list(self._probes.values()), {}
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        for engine in self.engines:
            if engine.events is not None:
                await engine.events.close()
            with contextlib.suppress(Exception):
                await engine.member.aclose()

    # -- routing ------------------------------------------------------------------------

    def views(self, request: EngineRequest, prompt: Prompt) -> list[EngineView]:
        """Each engine as the router sees it for ``request`` (pure). An engine that cannot
        enforce the request's structured outputs counts as unhealthy for it."""
        keys = prefix_keys(prompt, request.tenant)
        chains = _Chains(prompt.token_ids, request.tenant)
        return [
            EngineView(
                index=e.index,
                healthy=e.healthy and e.member.supports(request.sampling),
                num_inflight=e.num_inflight,
                max_inflight=e.max_inflight if self._admits(e, request) else e.num_inflight,
                num_running=e.load.num_running,
                num_waiting=e.load.num_waiting,
                kv_usage=e.load.kv_usage,
                match_tokens=e.match(keys, chains),
                pinned_match_tokens=e.pinned_match(keys),
                num_group_inflight=e.groups[request.group] if request.group else 0,
            )
            for e in self.engines
        ]

    def _admits(self, engine: PoolEngine, request: EngineRequest) -> bool:
        """Whether ``engine`` may start ``request`` now as far as background work goes
        (pure): a background request waits while foreground work holds the engine's
        background slots (preemption.py)."""
        if not request.background:
            return True
        return admits_background(engine.num_foreground, len(engine.background), self.max_background)

    def has_healthy(self, request: EngineRequest | None = None) -> bool:
        """Whether an engine is healthy (and can serve ``request``, when given)."""
        return any(
            e.healthy and (request is None or e.member.supports(request.sampling))
            for e in self.engines
        )

    async def acquire(self, request: EngineRequest, prompt: Prompt) -> Placement | None:
        """Route an attempt and take a slot on the chosen engine, waiting while every healthy
        engine is at its cap (mutates). While no engine is healthy, wait up to
        ``max_down_wait_s`` (in all, from the first time none is) for one to return; None
        when none has by then."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            if self.has_healthy(request):
                views = self.views(request, prompt)
                decision = route(
                    self.policy, views, len(prompt), last_index=self._last_index, params=self.params
                )
                if decision is not None:
                    return self._place(request, prompt, decision)
                timeout = None  # every healthy engine is at its cap: wait for a slot
            else:
                deadline = loop.time() + self.max_down_wait_s if deadline is None else deadline
                timeout = deadline - loop.time()
                if timeout <= 0:
                    return None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    def _place(self, request: EngineRequest, prompt: Prompt, decision: Decision) -> Placement:
        """Record the attempt on its engine (mutates): a slot, its prefixes (the engine
        will hold them once it has prefilled; followers may already follow), its pin, its
        group."""
        engine = self.engines[decision.index]
        self._last_index = decision.index
        self.decisions[decision.reason] += 1
        engine.num_inflight += 1
        engine.num_requests += 1
        keys = prefix_keys(prompt, request.tenant)
        engine.prefixes.insert(keys)
        engine.placed[request.request_id] = keys
        if request.pin_prefix_tokens > 0 and request.request_id not in engine.pins:
            end = request.pin_prefix_tokens
            engine.pins[request.request_id] = tuple(k for k in keys if k.num_tokens <= end)
        if request.group is not None:
            engine.groups[request.group] += 1
        log.debug("%s -> %s (%s)", request.request_id, engine.member.name, decision.reason)
        pause = None
        if request.background:
            engine.background[request.request_id] = BackgroundAttempt(
                request.request_id,
                request.priority,
                next(self._seq),
                preemptible=request.sampling.structured_outputs is None,
            )
            pause = engine.pauses[request.request_id] = asyncio.Event()
        else:
            engine.num_foreground += 1
            self._pause_excess(engine)
        return Placement(engine, decision, request.request_id, request.group, pause)

    def _pause_excess(self, engine: PoolEngine) -> None:
        """Mark the background attempts beyond the cap paused (mutates ``engine``)."""
        running = [
            a for a in engine.background.values() if not engine.pauses[a.request_id].is_set()
        ]
        for request_id in to_preempt(engine.num_foreground, running, self.max_background):
            engine.pauses[request_id].set()
            engine.num_preemptions += 1
            log.debug("pausing %s on %s", request_id, engine.member.name)

    def release(self, placement: Placement) -> None:
        """The attempt ended (mutates): free its slot, its group count and its place among
        the engine's foreground or background attempts."""
        engine = placement.engine
        engine.num_inflight -= 1
        engine.placed.pop(placement.request_id, None)
        if placement.pause is not None:
            engine.background.pop(placement.request_id, None)
            engine.pauses.pop(placement.request_id, None)
        else:
            engine.num_foreground -= 1
        if placement.group is not None:
            engine.groups[placement.group] -= 1
            if engine.groups[placement.group] <= 0:
                del engine.groups[placement.group]
        self._changed.set()

    async def unpin(self, request_id: str) -> None:
        """The graph no longer needs ``request_id``'s prefix (mutates)."""
        for engine in self.engines:
            if engine.pins.pop(request_id, None) is not None:
                await engine.member.unpin(request_id)

    async def reset_prefix_cache(self) -> tuple[bool, list[str]]:
        """Ask every healthy engine to empty its prefix cache (mutates; network); what this
        front predicted one holds goes when it did (its KV events say so themselves: vLLM
        publishes AllBlocksCleared). Whether every one did, and one reason per engine that
        cannot (it serves no reset, or it does not answer). A down engine is skipped: its
        prediction went when it was marked down."""
        healthy = [e for e in self.engines if e.healthy]
        results = await asyncio.gather(
            *(e.member.reset_prefix_cache() for e in healthy), return_exceptions=True
        )
        all_reset, failures = True, []
        for engine, result in zip(healthy, results, strict=True):
            if isinstance(result, EngineDown | EngineRejected):
                failures.append(str(result))
            elif isinstance(result, BaseException):
                raise result
            elif result:
                engine.prefixes.clear()
            else:
                all_reset = False
        return all_reset, failures

    # -- health -------------------------------------------------------------------------

    def mark_down(self, engine: PoolEngine, reason: str) -> None:
        """Take ``engine`` out of routing until a probe passes (mutates): its prefix
        knowledge and pins go (a restarted engine has an empty cache)."""
        if engine.healthy or engine.down_reason is None:
            log.warning("engine %s is down: %s", engine.member.name, reason)
        engine.healthy = False
        engine.down_reason = reason
        engine.num_failures += 1
        engine.prefixes.clear()
        engine.pins.clear()
        if engine.events is not None:
            engine.events.forget()
        self._changed.set()

    def stream_failed(self, engine: PoolEngine, reason: str) -> None:
        """A request's stream on ``engine`` failed (mutates): mark it down and probe it at
        once, so that an engine still alive is back after one handshake."""
        self.mark_down(engine, reason)
        self._probe_soon(engine)

    def _probe_soon(self, engine: PoolEngine) -> asyncio.Task[None]:
        """The re-probe of down ``engine`` in flight, or a new one (mutates): one per
        engine at a time, however many of its requests failed."""
        task = self._probes.get(engine.index)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._reprobe(engine))
            self._probes[engine.index] = task
        return task

    async def _reprobe(self, engine: PoolEngine) -> None:
        """Re-probe down ``engine`` (mutates): back in the pool, or down with the reason."""
        with self._down_on_failure(engine):
            await self._probe(engine)

    @contextlib.contextmanager
    def _down_on_failure(self, engine: PoolEngine) -> Iterator[None]:
        """Mark ``engine`` down with the reason a probe or scrape inside failed (mutates);
        nothing is raised: a bug in one probe must not stop the prober."""
        try:
            yield
        except (EngineDown, RemoteStartError) as exc:
            if engine.healthy or str(exc) != engine.down_reason:
                self.mark_down(engine, str(exc))
        except Exception as exc:
            log.exception("probing %s failed", engine.member.name)
            self.mark_down(engine, f"probe error: {exc}")

    async def _probe(self, engine: PoolEngine) -> None:
        """Handshake ``engine`` and return it to the pool (mutates). Raises EngineDown or
        RemoteStartError; an engine whose window is smaller than the pool's stays out."""
        window = await engine.member.probe()
        if window is not None and self.window is not None and window < self.window:
            raise RemoteStartError(
                f"engine {engine.member.name} came back with a context window of {window}, "
                f"smaller than the pool's {self.window}"
            )
        engine.window = window
        if self.window is None or (window is not None and window < self.window):
            self.window = window
        if engine.down_reason is not None:
            log.warning("engine %s is back in the pool", engine.member.name)
        engine.healthy, engine.down_reason = True, None
        self._changed.set()

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            await asyncio.gather(*(self._check(e) for e in self.engines))

    async def _check(self, engine: PoolEngine) -> None:
        """One round for one engine: scrape a healthy one's load, re-probe a down one (or
        wait for the probe a failed stream started). A failed scrape is re-probed at once,
        as a failed stream is: a one-off reset does not keep an engine out for a round."""
        if not engine.healthy:
            await self._probe_soon(engine)
            return
        with self._down_on_failure(engine):
            engine.load = await engine.member.load()
        if not engine.healthy:
            await self._probe_soon(engine)


class _Chains(dict[int, list[int]]):
    """A prompt's block keys per block size, computed on first use (one routing decision
    hashes the prompt once per block size, not once per engine)."""

    def __init__(self, token_ids: tuple[int, ...], tenant: str | None) -> None:
        super().__init__()
        self._token_ids, self._tenant = token_ids, tenant

    def __missing__(self, block_size: int) -> list[int]:
        keys = self[block_size] = chain_keys(self._token_ids, block_size, self._tenant)
        return keys
