"""Abandoned streams: when the last consumer of a stream stops early, cancel the variable's
producer on the server, unless something else in the session may still want it.

The server cancels a variable's *producer*: every unfinished output of that call, and
everything downstream of them, fails with ``cancelled`` (protocol.md, ``cancel``). The
client can tell when that would hurt nobody, because every declaration came from it. An
abandoned stream's variable is cancelled when all of these hold:

- it is still PENDING and the session open;
- no get of it is in flight and no other stream of it has a consumer;
- it is the output of a call (not a constant, placeholder or op) declared in this session;
- no call or op declared in this session reads it (the server would fail that reader, and
  whatever it feeds, even if nothing asked for it yet);
- every other unfinished output of the same call is unwanted: not read by a declared call or
  op, not waited for, and no longer held by the application (a dropped variable can never be
  asked for again; one still held may be).

Cancelling goes on upstream, since the server's ``cancel`` only reaches downstream: a call or
op feeding the cancelled work is cancelled too when the application dropped all its outputs
and only cancelled work reads them (the work only this stream was waiting for).

:class:`Wiring` is the client's copy of the graph's edges (declaring happens on any thread,
so one lock guards it; released variables are forgotten, so a long-lived session does not
grow it). :class:`Abandonment` applies the rule and sends the cancels. See docs/sdk.md,
"Abandoned streams".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from eclectus.adapters.client.errors import ConnectionError, EclectusClientError, VariableFailed
from eclectus.adapters.client.outbox import Outbox
from eclectus.adapters.client.router import Router
from eclectus.adapters.client.variables import SemanticVariable, VarState
from eclectus.protocol import CallSpec, Cancel, GenSegment, MapSpec, OpSpec, VarSegment

log = logging.getLogger(__name__)


Use = Literal["wanted", "finished", "dropped"]
"""What the application does with a variable: waits for it or holds it unfinished, holds it
finished, or dropped it (it can never be asked for again)."""


@dataclass(frozen=True, slots=True)
class _Node:
    """A declared call or op, as edges."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    is_call: bool


class Wiring:
    """Producers and readers of this session's variables (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}  # call or op id -> its edges
        self._producer: dict[str, str] = {}  # output var id -> call or op id
        self._readers: dict[str, set[str]] = {}  # var id -> ids of calls and ops reading it

    def note(
        self, call: CallSpec | None = None, op: OpSpec | None = None, map: MapSpec | None = None
    ) -> None:
        """Records a declared call's, op's or map's edges (mutates)."""
        nodes: list[tuple[str, _Node]] = []
        if map is not None:  # a map reads its items and its steps' other inputs
            steps = [_edges(call) for call in (map.call, *map.then)]
            local = {map.element, *(v for _, outputs in steps for v in outputs)}
            inputs = [v for reads, _ in steps for v in reads if v not in local]
            outputs = (map.output, *map.step_outputs)
            nodes.append((map.id, _Node((map.items, *inputs), outputs, is_call=False)))
        if call is not None:
            nodes.append((call.id, _Node(*_edges(call), is_call=True)))
        if op is not None:
            nodes.append((op.id, _Node(tuple(op.inputs), (op.output,), is_call=False)))
        with self._lock:
            for node_id, node in nodes:
                self._nodes[node_id] = node
                for var_id in node.outputs:
                    self._producer[var_id] = node_id
                for var_id in node.inputs:
                    self._readers.setdefault(var_id, set()).add(node_id)

    def forget(self, var_ids: Iterable[str]) -> None:
        """Drops released variables (mutates). The outputs of a call or op are kept until
        all of them are released: the rule still asks who reads a released output while a
        sibling of it lives."""
        with self._lock:
            for var_id in var_ids:
                node_id = self._producer.pop(var_id, None)
                if node_id is None:
                    self._readers.pop(var_id, None)
                    continue
                outputs = self._nodes[node_id].outputs
                if not any(v in self._producer for v in outputs):
                    del self._nodes[node_id]
                    for output in outputs:
                        self._readers.pop(output, None)

    def producers_to_cancel(self, var_id: str, use: Callable[[str], Use]) -> list[str]:
        """The variables to name in ``cancel`` frames, one per producer, ``var_id`` first;
        empty when its producer must not be cancelled. The producer: a call, whose outputs
        nobody reads and whose other outputs are not ``wanted``. Then, to a fixed point,
        every call or op upstream whose outputs were all ``dropped`` and are read only by
        producers already in the list: the work only this stream waited for. Pure; calls
        ``use`` under the lock."""
        with self._lock:
            first = self._producer.get(var_id)
            if first is None or not self._nodes[first].is_call:
                return []  # a constant, a placeholder or an op's output
            outputs = self._nodes[first].outputs
            if any(self._readers.get(v) for v in outputs):
                return []
            if any(use(v) == "wanted" for v in outputs if v != var_id):
                return []
            doomed = [first]
            while (more := self._upstream_unwanted(doomed, use)) is not None:
                doomed.append(more)
            return [var_id, *(self._nodes[n].outputs[0] for n in doomed[1:])]

    def _upstream_unwanted(self, doomed: list[str], use: Callable[[str], Use]) -> str | None:
        """One call or op feeding ``doomed`` whose outputs were all dropped and are read
        only by ``doomed``, or None (pure; under the lock)."""
        for node_id in doomed:
            for input_id in self._nodes[node_id].inputs:
                upstream = self._producer.get(input_id)
                if upstream is None or upstream in doomed:
                    continue
                outputs = self._nodes[upstream].outputs
                if all(
                    self._readers.get(v, set()) <= set(doomed) and use(v) == "dropped"
                    for v in outputs
                ):
                    return upstream
        return None


def _edges(call: CallSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A call's input and output variable ids, in either of its forms (pure)."""
    if call.segments is not None:
        inputs = tuple(s.var for s in call.segments if isinstance(s, VarSegment))
        return inputs, tuple(s.gen for s in call.segments if isinstance(s, GenSegment))
    bind, sampling = call.bind, call.sampling
    inputs = tuple(var_id for name, var_id in bind.items() if name not in sampling)
    return inputs, tuple(var_id for name, var_id in bind.items() if name in sampling)


class Abandonment:
    """Cancels the producers of abandoned streams (lives on the session's loop)."""

    def __init__(
        self,
        wiring: Wiring,
        router: Router,
        outbox: Outbox,
        lookup: Callable[[str], SemanticVariable | None],
        new_id: Callable[[str], str],
    ) -> None:
        self._wiring = wiring
        self._router = router
        self._outbox = outbox
        self._lookup = lookup
        self._new_id = new_id
        self._sending: set[asyncio.Task[None]] = set()  # cancels on their way

    def on_abandoned(self, var: SemanticVariable) -> None:
        """The last consumer of ``var``'s stream left before its end (``break``,
        ``aclose``, a cancelled task, a closed sync iterator), after its get was sent. When
        the rule allows, ``var`` fails with ``cancelled`` now and the ``cancel`` frames
        leave from a task of their own: this runs in the stream's ``finally``, maybe inside
        a cancelled task, so it awaits nothing. Mutates ``var``."""
        if var.state is not VarState.PENDING or self._router.closed is not None:
            return
        if self._router.is_waited(var.id):
            return
        var_ids = self._wiring.producers_to_cancel(var.id, self._use)
        if not var_ids:
            return
        message = "its stream was abandoned, so the client cancelled its producer"
        var._fail(VariableFailed("cancelled", message, var=var.id))
        task = asyncio.get_running_loop().create_task(self._send_cancels(var_ids))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _use(self, var_id: str) -> Use:
        """What the application does with ``var_id`` (pure): waits for it (a get or stream
        in flight) or holds it unfinished, holds it finished, or dropped it."""
        var = self._lookup(var_id)
        if self._router.is_waited(var_id) or (var is not None and not var.done()):
            return "wanted"
        return "dropped" if var is None else "finished"

    async def _send_cancels(self, var_ids: list[str]) -> None:
        """Sends one ``cancel`` per variable, in order. Nobody awaits the answers, so a
        refusal or a lost connection is only logged (a closing session cancels its work
        anyway)."""
        for var_id in var_ids:
            frame_id = self._new_id("k")
            reply = self._router.expect_reply(frame_id)
            try:
                await self._outbox.send(Cancel(id=frame_id, var=var_id))
                await reply
            except ConnectionError:
                return  # the session is gone, and its work with it
            except EclectusClientError as exc:  # e.g. unknown_var: released meanwhile
                log.debug("cancel of %s for an abandoned stream refused: %s", var_id, exc)
