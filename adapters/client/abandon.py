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

:class:`Wiring` is the client's copy of the graph's edges (declaring happens on any thread,
so one lock guards it; released variables are forgotten, so a long-lived session does not
grow it). :class:`Abandonment` applies the rule and sends the cancel. See docs/sdk.md,
"Abandoned streams".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable

from eclectus.adapters.client.errors import EclectusClientError, VariableFailed
from eclectus.adapters.client.outbox import Outbox
from eclectus.adapters.client.router import Router
from eclectus.adapters.client.variables import SemanticVariable, VarState
from eclectus.server.protocol import CallSpec, Cancel, GenSegment, OpSpec, VarSegment

log = logging.getLogger(__name__)


class Wiring:
    """Readers and call siblings of this session's variables (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: set[str] = set()  # ids of variables some declared call or op reads
        self._outputs_of: dict[str, tuple[str, ...]] = {}  # call output -> all its outputs

    def note(self, call: CallSpec | None = None, op: OpSpec | None = None) -> None:
        """Records a declared call's or op's inputs and a call's outputs (mutates)."""
        inputs: list[str] = list(op.inputs) if op is not None else []
        outputs: tuple[str, ...] = ()
        if call is not None:
            call_inputs, outputs = _edges(call)
            inputs += call_inputs
        with self._lock:
            self._read.update(inputs)
            for var_id in outputs:
                self._outputs_of[var_id] = outputs

    def forget(self, var_ids: Iterable[str]) -> None:
        """Drops released variables (mutates). A call's output stays marked as read until
        every output of the call is released: a live sibling's rule still asks about it."""
        with self._lock:
            for var_id in var_ids:
                outputs = self._outputs_of.pop(var_id, None)
                if outputs is None:
                    self._read.discard(var_id)
                elif not any(v in self._outputs_of for v in outputs):
                    self._read.difference_update(outputs)

    def may_cancel_producer(self, var_id: str, is_wanted: Callable[[str], bool]) -> bool:
        """The declaration half of the rule: ``var_id`` is a call's output, no declared call
        or op reads it, and every other output of its call is unread and not
        ``is_wanted``. Pure."""
        with self._lock:
            outputs = self._outputs_of.get(var_id)
            if outputs is None or var_id in self._read:
                return False  # not a call's output (a constant, placeholder, op), or read
            siblings = [v for v in outputs if v != var_id]
            if any(v in self._read for v in siblings):
                return False
        return not any(is_wanted(v) for v in siblings)


def _edges(call: CallSpec) -> tuple[list[str], tuple[str, ...]]:
    """A call's input and output variable ids, in either of its forms (pure)."""
    if call.segments is not None:
        inputs = [s.var for s in call.segments if isinstance(s, VarSegment)]
        return inputs, tuple(s.gen for s in call.segments if isinstance(s, GenSegment))
    inputs = [var_id for name, var_id in call.bind.items() if name not in call.sampling]
    return inputs, tuple(var_id for name, var_id in call.bind.items() if name in call.sampling)


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
        the rule allows, ``var`` fails with ``cancelled`` now and a ``cancel`` frame leaves
        from a task of its own: this runs in the stream's ``finally``, maybe inside a
        cancelled task, so it awaits nothing. Mutates ``var``."""
        if var.state is not VarState.PENDING or self._router.closed is not None:
            return
        if self._router.is_waited(var.id):
            return
        if not self._wiring.may_cancel_producer(var.id, self._is_wanted):
            return
        message = "its stream was abandoned, so the client cancelled its producer"
        var._fail(VariableFailed("cancelled", message, var=var.id))
        task = asyncio.get_running_loop().create_task(self._send_cancel(var.id))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def _is_wanted(self, var_id: str) -> bool:
        """Whether the application may still want ``var_id``: a get or stream of it is in
        flight, or it is unfinished and still held (pure)."""
        var = self._lookup(var_id)
        return self._router.is_waited(var_id) or (var is not None and not var.done())

    async def _send_cancel(self, var_id: str) -> None:
        """Sends ``cancel``. Nobody awaits the answer, so a refusal or a lost connection is
        only logged (a closing session cancels its work anyway)."""
        frame_id = self._new_id("k")
        reply = self._router.expect_reply(frame_id)
        try:
            await self._outbox.send(Cancel(id=frame_id, var=var_id))
            await reply
        except EclectusClientError as exc:
            log.debug("cancel of abandoned stream %s not acknowledged: %s", var_id, exc)
