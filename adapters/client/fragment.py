"""The pending graph fragment: what the client has declared but not yet sent.

Calling a semantic function sends nothing; it appends variables and a call here. The next
``aget``/``astream``/``flush``/``aset`` takes the whole fragment at once and ships it in one
``submit`` frame, so the number of client frames does not grow with fan-out. Any thread may
add while the session's loop takes: one lock guards the lists and the id counter.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from eclectus.server.protocol import CallSpec, GetSpec, OpSpec, Submit, VarSpec


@dataclass(slots=True)
class Fragment:
    """Variables, calls and ops in declaration order (a call only references variables
    declared before it, so this order is already a valid order for the server)."""

    vars: list[VarSpec] = field(default_factory=list)
    calls: list[CallSpec] = field(default_factory=list)
    ops: list[OpSpec] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.vars or self.calls or self.ops)

    def declared_ids(self) -> list[str]:
        """Ids of the variables this fragment declares (pure)."""
        return [spec.id for spec in self.vars]

    def to_submit(self, frame_id: str, gets: list[GetSpec]) -> Submit:
        """The ``submit`` frame carrying this fragment and ``gets`` (pure)."""
        return Submit(id=frame_id, vars=self.vars, calls=self.calls, ops=self.ops, gets=gets)


class PendingFragment:
    """Thread-safe accumulator of declarations plus the session's id allocator."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._current = Fragment()

    def new_id(self, prefix: str) -> str:
        """A session-unique id such as ``v17`` (mutates the counter)."""
        with self._lock:
            return f"{prefix}{next(self._counter)}"

    def add(
        self,
        vars: Sequence[VarSpec] = (),
        call: CallSpec | None = None,
        op: OpSpec | None = None,
    ) -> None:
        """Appends declarations atomically, so a concurrent ``take`` sees all or none of one
        semantic call (mutates)."""
        with self._lock:
            self._current.vars.extend(vars)
            if call is not None:
                self._current.calls.append(call)
            if op is not None:
                self._current.ops.append(op)

    def take(self) -> Fragment:
        """Removes and returns everything pending (mutates: leaves an empty fragment)."""
        with self._lock:
            taken, self._current = self._current, Fragment()
            return taken

    def __len__(self) -> int:
        """Number of pending declarations (vars + calls + ops)."""
        with self._lock:
            current = self._current
            return len(current.vars) + len(current.calls) + len(current.ops)
