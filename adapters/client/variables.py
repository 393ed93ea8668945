"""SemanticVariable: a future for the text of one named prompt field.

A variable is declared by a semantic function call (an output), by ``app.variable`` (a
constant, or a placeholder the client sets later) or by an op (``app.join``). Passing it as
another call's input wires the graph on the server; nothing travels until someone asks for
a value (``aget``/``get``/``astream``/``stream``) or flushes.

State lives here (PENDING -> READY | FAILED, each transition once); the mechanics of asking
live in the session, which routes the server's answer back to :meth:`_resolve` or
:meth:`_fail` on the session's event loop.
"""

from __future__ import annotations

import enum
import json
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from eclectus.protocol import Criteria, StructuredOutputs, Usage

if TYPE_CHECKING:
    from eclectus.adapters.client.session import Session


class VarState(enum.Enum):
    PENDING = "pending"  # no value known to the client yet
    READY = "ready"  # value known (constant, set by the client, or answered by the server)
    FAILED = "failed"  # will never get a value; ``error`` says why


class SemanticVariable:
    """A future for one variable's text. Cheap to create; safe to share between threads."""

    __slots__ = (
        "__weakref__",
        "_constraint",
        "_error",
        "_finish_reason",
        "_id",
        "_name",
        "_session",
        "_state",
        "_usage",
        "_value",
    )

    def __init__(
        self, session: Session, var_id: str, name: str | None = None, value: str | None = None
    ) -> None:
        self._session = session
        self._id = var_id
        self._name = name
        self._value = value
        self._state = VarState.READY if value is not None else VarState.PENDING
        self._error: BaseException | None = None
        self._usage: Usage | None = None
        self._finish_reason: str | None = None
        self._constraint: StructuredOutputs | None = None  # set by the call that produces it

    # -- read-only views ----------------------------------------------------------------

    @property
    def id(self) -> str:
        """The session-unique wire id (``v17``)."""
        return self._id

    @property
    def name(self) -> str | None:
        """The placeholder name it was declared under, if any."""
        return self._name

    @property
    def session(self) -> Session:
        return self._session

    @property
    def state(self) -> VarState:
        return self._state

    @property
    def value(self) -> str | None:
        """The text if known (READY), else None. Never waits."""
        return self._value

    @property
    def error(self) -> BaseException | None:
        """Why the variable failed (FAILED), else None."""
        return self._error

    @property
    def usage(self) -> Usage | None:
        """Token counts of the producing call, once its value arrived (None for constants,
        client-set values and op outputs)."""
        return self._usage

    @property
    def finish_reason(self) -> str | None:
        """``stop``/``length``/... of the producing call, once its value arrived."""
        return self._finish_reason

    @property
    def constraint(self) -> StructuredOutputs | None:
        """The structured-output constraint of the producing call's output, if any."""
        return self._constraint

    def parsed(self) -> Any:
        """The value parsed (pure; the variable must be READY): a JSON value for an output
        constrained by ``json_schema``/``json_object``, else the text itself. ValueError
        when the variable has no value yet."""
        if self._value is None:
            raise ValueError(f"{self!r} has no value yet: aget() it first")
        if self._constraint is not None and self._constraint.kind in ("json", "json_object"):
            return json.loads(self._value)
        return self._value

    def done(self) -> bool:
        """True once the variable is READY or FAILED."""
        return self._state is not VarState.PENDING

    def __repr__(self) -> str:
        label = f" {self._name!r}" if self._name else ""
        return f"<SemanticVariable {self._id}{label} {self._state.value}>"

    # -- asking for the value (the session does the work) --------------------------------

    async def aget(
        self,
        criteria: Criteria = "latency",
        *,
        deadline_ms: float | None = None,
        parse: bool = False,
    ) -> Any:
        """Waits for the text, shipping everything pending in one frame first. Callable from
        any event loop. Raises VariableFailed/ServerError/ConnectionError. Mutates only
        through the answer (state becomes READY or FAILED). ``parse=True`` returns
        :meth:`parsed` (the JSON value of a json-constrained output)."""
        (text,) = await self._session.aget_many([self], criteria, deadline_ms=deadline_ms)
        return self.parsed() if parse else text

    def get(
        self,
        criteria: Criteria = "latency",
        *,
        deadline_ms: float | None = None,
        timeout: float | None = None,
        parse: bool = False,
    ) -> Any:
        """Blocking twin of :meth:`aget` (not from the session's own loop thread)."""
        (text,) = self._session.get_many([self], criteria, deadline_ms=deadline_ms, timeout=timeout)
        return self.parsed() if parse else text

    def astream(
        self, criteria: Criteria = "latency", *, deadline_ms: float | None = None
    ) -> AsyncIterator[str]:
        """Async iterator of text deltas; they concatenate to the final value. A variable
        that is already READY yields its whole text once. The get carries ``criteria`` and
        ``deadline_ms`` as :meth:`aget`'s does."""
        return self._session.astream(self, criteria, deadline_ms=deadline_ms)

    def stream(
        self,
        criteria: Criteria = "latency",
        *,
        deadline_ms: float | None = None,
        timeout: float | None = None,
    ) -> Iterator[str]:
        """Blocking twin of :meth:`astream`; ``timeout`` bounds the wait for each delta."""
        return self._session.stream(self, criteria, deadline_ms=deadline_ms, timeout=timeout)

    async def aset(self, text: str) -> None:
        """Supplies the value of a placeholder declared with ``app.variable()`` (a ``set``
        frame, after flushing what is pending). Mutates: the variable becomes READY once the
        server accepts it; raises ServerError when it refuses (e.g. the variable has a
        producer)."""
        await self._session.aset(self, text)

    def set(self, text: str, *, timeout: float | None = None) -> None:
        """Blocking twin of :meth:`aset`."""
        self._session.set(self, text, timeout=timeout)

    async def acancel(self) -> None:
        """Cancels the producer on the server; this variable and everything downstream fail
        with ``cancelled`` (waiting gets raise VariableFailed). Mutates server state."""
        await self._session.acancel(self)

    def cancel(self, *, timeout: float | None = None) -> None:
        """Blocking twin of :meth:`acancel`."""
        self._session.cancel(self, timeout=timeout)

    # -- transitions (the session calls these on its loop) -------------------------------

    def _resolve(
        self, text: str, usage: Usage | None = None, finish_reason: str | None = None
    ) -> None:
        """PENDING -> READY (mutates). A second answer for a READY variable is ignored: the
        server may answer two gets of the same variable."""
        if self._state is VarState.PENDING:
            self._value, self._usage, self._finish_reason = text, usage, finish_reason
            self._state = VarState.READY

    def _fail(self, error: BaseException) -> None:
        """PENDING -> FAILED (mutates); a variable that already has a value keeps it."""
        if self._state is VarState.PENDING:
            self._error = error
            self._state = VarState.FAILED
