"""The pending graph fragment: what the client has declared but not yet sent.

Calling a semantic function sends nothing; it appends variables and a call here. The next
``aget``/``astream``/``flush``/``aset`` takes the whole fragment at once and ships it in one
``submit`` frame, so the number of client frames does not grow with fan-out. Any thread may
add while the session's loop takes: one lock guards the lists and the id counter.

Only a fragment larger than the server's ``max_frame_bytes`` (long constant documents in a
wide map step) is split, by :func:`plan_submits`: every variable declaration goes first, then
calls, ops and gets, packed greedily. That order is always valid for the server, which
needs a call's inputs and outputs declared (in this or an earlier fragment), not produced,
and starts nothing before a get arrives.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eclectus.adapters.client.wire import encode_frame
from eclectus.protocol import (
    CallSpec,
    GenSegment,
    GetSpec,
    MapSpec,
    OpSpec,
    Submit,
    SwitchSpec,
    VarSpec,
)

Item = VarSpec | CallSpec | OpSpec | MapSpec | SwitchSpec | GetSpec

SUBMIT_OVERHEAD_BYTES = 256  # the frame's own keys and id around the packed items


@dataclass(slots=True)
class Fragment:
    """Variables, calls, ops, maps and switches in declaration order (a call only
    references variables declared before it, so this order is already a valid order for
    the server; a switch guards nodes declared before it)."""

    vars: list[VarSpec] = field(default_factory=list)
    calls: list[CallSpec] = field(default_factory=list)
    ops: list[OpSpec] = field(default_factory=list)
    maps: list[MapSpec] = field(default_factory=list)
    switches: list[SwitchSpec] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.vars or self.calls or self.ops or self.maps or self.switches)

    def to_submit(self, frame_id: str, gets: list[GetSpec]) -> Submit:
        """The ``submit`` frame carrying this fragment and ``gets`` (pure)."""
        return Submit(
            id=frame_id,
            vars=self.vars,
            calls=self.calls,
            ops=self.ops,
            maps=self.maps,
            switches=self.switches,
            gets=gets,
        )


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
        map: MapSpec | None = None,
        switch: SwitchSpec | None = None,
    ) -> None:
        """Appends declarations atomically, so a concurrent ``take`` sees all or none of one
        semantic call (mutates)."""
        with self._lock:
            self._current.vars.extend(vars)
            if call is not None:
                self._current.calls.append(call)
            if op is not None:
                self._current.ops.append(op)
            if map is not None:
                self._current.maps.append(map)
            if switch is not None:
                self._current.switches.append(switch)

    def retract(self, node_ids: set[str], var_ids: set[str]) -> int:
        """Removes pending calls, ops, maps and switches whose id is in ``node_ids``, and
        variable declarations in ``var_ids`` or output by a removed op or map (a map's
        step outputs too) (mutates). Returns how many nodes were still pending (the rest
        were shipped already: on the server they stay idle)."""
        with self._lock:
            c = self._current
            before = len(c.calls) + len(c.ops) + len(c.maps) + len(c.switches)
            removed = [x for x in (*c.ops, *c.maps) if x.id in node_ids]
            var_ids = var_ids | {x.output for x in removed}
            var_ids |= {v for x in removed if isinstance(x, MapSpec) for v in x.step_outputs}
            c.calls = [x for x in c.calls if x.id not in node_ids]
            c.ops = [x for x in c.ops if x.id not in node_ids]
            c.maps = [x for x in c.maps if x.id not in node_ids]
            c.switches = [x for x in c.switches if x.id not in node_ids]
            c.vars = [x for x in c.vars if x.id not in var_ids]
            return before - (len(c.calls) + len(c.ops) + len(c.maps) + len(c.switches))

    def take(self) -> Fragment:
        """Removes and returns everything pending (mutates: leaves an empty fragment)."""
        with self._lock:
            taken, self._current = self._current, Fragment()
            return taken

    def __len__(self) -> int:
        """Number of pending declarations (vars + calls + ops + maps + switches)."""
        with self._lock:
            c = self._current
            return len(c.vars) + len(c.calls) + len(c.ops) + len(c.maps) + len(c.switches)


def plan_submits(
    fragment: Fragment, gets: list[GetSpec], max_bytes: int, new_frame_id: Callable[[], str]
) -> list[Submit]:
    """The submit frames that carry ``fragment`` and ``gets``: one when it fits in
    ``max_bytes``, else several in a valid order (pure but for the ids it draws). An item
    too large on its own still gets a frame of its own, which the sender then refuses."""
    whole = fragment.to_submit(new_frame_id(), gets)
    if len(encode_frame(whole).encode()) <= max_bytes:
        return [whole]
    # maps before ops: a spread op reads a map's output, and must see it declared; switches
    # after all three: the server finds the nodes they guard (still idle: gets come last)
    items: list[Item] = [
        *fragment.vars,
        *fragment.calls,
        *fragment.maps,
        *fragment.ops,
        *fragment.switches,
        *gets,
    ]
    chunks: list[list[Item]] = [[]]
    used = SUBMIT_OVERHEAD_BYTES
    for item in items:
        cost = _size(item) + 1  # the comma
        if chunks[-1] and used + cost > max_bytes:
            chunks.append([])
            used = SUBMIT_OVERHEAD_BYTES
        chunks[-1].append(item)
        used += cost
    frame_ids = [whole.id or new_frame_id(), *(new_frame_id() for _ in chunks[1:])]
    return [_submit_of(frame_id, chunk) for frame_id, chunk in zip(frame_ids, chunks, strict=True)]


def created_ids(frame: Submit) -> list[str]:
    """Variables that exist only if ``frame`` is accepted: those it declares and the outputs
    of its calls and ops (pure)."""
    outputs = [s.gen for c in frame.calls for s in c.segments or () if isinstance(s, GenSegment)]
    outputs += [op.output for op in frame.ops] + [m.output for m in frame.maps]
    return list(dict.fromkeys([*(spec.id for spec in frame.vars), *outputs]))


def _size(model: Item) -> int:
    return len(model.model_dump_json(exclude_defaults=True).encode())


def _submit_of(frame_id: str, items: list[Item]) -> Submit:
    return Submit(
        id=frame_id,
        vars=[i for i in items if isinstance(i, VarSpec)],
        calls=[i for i in items if isinstance(i, CallSpec)],
        ops=[i for i in items if isinstance(i, OpSpec)],
        maps=[i for i in items if isinstance(i, MapSpec)],
        switches=[i for i in items if isinstance(i, SwitchSpec)],
        gets=[i for i in items if isinstance(i, GetSpec)],
    )
