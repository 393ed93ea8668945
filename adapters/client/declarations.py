"""The declaring half of a session: building the graph fragment, with no I/O.

``function``/``call``/``variable``/``join``/``repr_list`` only append to the pending fragment
and return SemanticVariable futures; they are safe from any thread. The session
(session.py) adds the asking half, which ships the fragment.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from eclectus.adapters.client.abandon import Wiring
from eclectus.adapters.client.errors import ConnectionError
from eclectus.adapters.client.fragment import PendingFragment
from eclectus.adapters.client.functions import (
    Piece,
    SamplingLike,
    SemanticFunction,
    declare_call,
)
from eclectus.adapters.client.map_steps import MapSteps
from eclectus.adapters.client.variables import SemanticVariable
from eclectus.protocol import CallSpec, GenSegment, MapSpec, OpSpec, SwitchSpec, VarSpec
from eclectus.protocol.frames import TextOpKind

if TYPE_CHECKING:
    from eclectus.adapters.client.session import Session


class Declarations:
    """Pending fragment, id allocation and the registry of live variables (by id, weakly:
    a variable nobody holds needs no answer)."""

    def __init__(self) -> None:
        self._pending = PendingFragment()
        self._vars: weakref.WeakValueDictionary[str, SemanticVariable] = (
            weakref.WeakValueDictionary()
        )
        self._vars_lock = threading.Lock()
        # ids of variables nobody holds any more, for the server's ``release`` frame (a
        # deque: finalizers append from whatever thread drops the last reference)
        self._released: deque[str] = deque()
        self._wiring = Wiring()  # who reads what, for the abandoned-stream rule
        # output variable id -> the id of the call, op or map producing it (for switch)
        self._producers: dict[str, str] = {}
        # a map step's local output id -> its MapSteps builder's id (only later steps of
        # that builder may read it: map_steps.py)
        self._map_locals: dict[str, str] = {}

    @property
    def _session(self) -> Session:
        # Declarations only ever exists as the base of Session; variables and functions
        # hold the full session because they also ask (I/O) through it.
        return cast("Session", self)

    def _closed_reason(self) -> BaseException | None:
        """Why the session can take no more work, or None while it is open (pure)."""
        raise NotImplementedError

    @property
    def num_pending(self) -> int:
        """Declarations not yet shipped (vars + calls + ops)."""
        return len(self._pending)

    # -- declaring (no I/O, any thread) ---------------------------------------------------

    def function(
        self,
        template: str,
        /,
        *,
        model: str | None = None,
        outputs: Mapping[str, SamplingLike] | None = None,
        **output_specs: SamplingLike,
    ) -> SemanticFunction:
        """A semantic function over ``template``. Placeholders given a sampling spec (here
        as keywords, or in ``outputs=`` for names like ``model``) are outputs; the others are
        inputs. ValueError for a malformed template or spec. Pure (declares nothing)."""
        return SemanticFunction(self._session, template, {**(outputs or {}), **output_specs}, model)

    def call(
        self,
        pieces: Sequence[Piece],
        *,
        model: str | None = None,
        add_special_tokens: bool = True,
    ) -> list[SemanticVariable]:
        """Declares one call in segment form: ``str`` constants, SemanticVariable inputs and
        :class:`Gen` outputs, in prompt order. Returns the outputs (mutates the pending
        fragment). ``add_special_tokens`` False: the pieces are a rendered chat template
        (no BOS added; CallSpec.add_special_tokens)."""
        return declare_call(self._session, pieces, model, add_special_tokens)

    def variable(self, value: str | None = None, name: str | None = None) -> SemanticVariable:
        """Declares a constant (``value``) or a placeholder the client sets later with
        ``aset``/``set`` (mutates the pending fragment)."""
        var = self.new_variable(name=name, value=value)
        self.declare([VarSpec(id=var.id, name=name, value=value)])
        return var

    def join(
        self,
        items: Iterable[str | SemanticVariable],
        sep: str = "",
        prefix: str = "",
        suffix: str = "",
    ) -> SemanticVariable:
        """A variable the server computes as ``prefix + sep.join(items) + suffix`` once the
        inputs are known (an OpSpec; mutates the pending fragment)."""
        return self._op("join", items, sep=sep, prefix=prefix, suffix=suffix)

    def repr_list(self, items: Iterable[str | SemanticVariable]) -> SemanticVariable:
        """A variable holding ``repr([...])`` of the items' texts, as LangChain renders a
        list in a prompt (an OpSpec; mutates the pending fragment)."""
        return self._op("repr_list", items)

    def map(
        self,
        items: SemanticVariable,
        element: SemanticVariable,
        pieces: Sequence[Piece] | MapSteps,
        *,
        items_path: Sequence[str] = (),
        model: str | None = None,
    ) -> SemanticVariable:
        """A fan-out on the server (a MapSpec): one call of ``pieces`` per element of the
        JSON array ``items`` holds (at ``items_path``), with ``element`` (a variable from
        :meth:`new_variable`, never declared) standing for the element. Returns the variable
        holding the JSON array of the calls' outputs (mutates the pending fragment).
        ValueError unless ``pieces`` have exactly one :class:`Gen`. ``pieces`` may instead
        be a :class:`MapSteps` of ``element`` (:meth:`map_steps`): a pipeline of calls per
        element, whose last step's outputs the array holds (see :meth:`map_pipeline`; give
        each step its ``model`` there, not here)."""
        if isinstance(pieces, MapSteps):
            if model is not None:
                raise ValueError("model= is for a piece list: give each steps.call its model")
            if pieces.element is not element:
                raise ValueError(f"{pieces!r} was built for {pieces.element!r}, not {element!r}")
            return self.map_pipeline(items, pieces, items_path=items_path)[0]
        steps = self.map_steps(element)  # one step: the same MapSpec, ``then`` empty
        steps.call(pieces, model=model)
        return self.map_pipeline(items, steps, items_path=items_path)[0]

    def map_steps(self, element: SemanticVariable) -> MapSteps:
        """A builder of a map's per-element pipeline of calls over ``element`` (a variable
        from :meth:`new_variable`, never declared). Pure: declares nothing."""
        return MapSteps(self._session, element)

    def map_pipeline(
        self,
        items: SemanticVariable,
        steps: MapSteps,
        *,
        items_path: Sequence[str] = (),
        step_outputs: bool = False,
    ) -> tuple[SemanticVariable, list[SemanticVariable]]:
        """A fan-out on the server running ``steps`` (:meth:`map_steps`) per element of the
        JSON array ``items`` holds (at ``items_path``), each step after the one before it.
        Returns the variable holding the JSON array of the last step's outputs (element
        order) and, with ``step_outputs``, one variable per earlier step holding the array
        of that step's outputs (``[]`` otherwise, or for one step). Mutates the pending
        fragment; ValueError for a builder with no steps."""
        self.check_owned(items)
        if steps.element.session is not self:
            raise ValueError(f"{steps!r} belongs to another session")
        calls = steps.calls
        if not calls:
            raise ValueError(f"{steps!r} has no steps: add one with steps.call([...])")
        output = self.new_variable(name="map")
        earlier = [self.new_variable(name="map_step") for _ in calls[1:]] if step_outputs else []
        spec = MapSpec(
            id=self.new_id("m"),
            items=items.id,
            items_path=list(items_path),
            element=steps.element.id,
            call=calls[0],
            then=list(calls[1:]),
            output=output.id,
            step_outputs=[v.id for v in earlier],
        )
        declared = [VarSpec(id=v.id, name=v.name) for v in (output, *earlier)]
        self.declare(declared, map=spec)
        return output, earlier

    def switch(
        self,
        on: SemanticVariable,
        cases: Mapping[str, Iterable[SemanticVariable]],
        path: Sequence[str] = (),
    ) -> str:
        """Routing on the server (a SwitchSpec): ``on`` is the output of a call constrained
        to a ``choice`` of literals, or with ``path`` (object keys) of a call constrained to
        a JSON Schema pinning that field to an ``enum`` of strings; each case lists outputs
        whose producers (calls, ops, maps of this session, not yet shipped with a get) run
        only when ``on`` is that literal. The others are skipped: their outputs, and
        whatever reads them, fail with ``skipped`` (VariableFailed). Returns the switch's
        id. Mutates the pending fragment; ValueError for a variable no call, op or map of
        this session produces."""
        self.check_owned(on)
        guarded: dict[str, list[str]] = {}
        for literal, outputs in cases.items():
            guarded[literal] = []
            for var in outputs:
                self.check_owned(var)
                producer = self._producers.get(var.id)
                if producer is None:
                    raise ValueError(f"{var!r} is not the output of a call, op or map")
                if producer not in guarded[literal]:
                    guarded[literal].append(producer)
        spec = SwitchSpec(id=self.new_id("w"), on=on.id, path=list(path), cases=guarded)
        self.declare([], switch=spec)
        return spec.id

    def retract(self, outputs: Iterable[SemanticVariable], switch_ids: Iterable[str] = ()) -> int:
        """Takes back declarations not shipped yet: the calls, ops and maps producing
        ``outputs`` and the switches ``switch_ids`` (a speculation the caller gave up).
        Returns how many were still pending; one shipped already stays on the server,
        idle (nothing runs without a get). Mutates the pending fragment."""
        var_ids = {var.id for var in outputs}
        with self._vars_lock:
            node_ids = {self._producers[v] for v in var_ids if v in self._producers}
        return self._pending.retract(node_ids | set(switch_ids), var_ids)

    def spread_repr_list(self, mapped: SemanticVariable) -> SemanticVariable:
        """``repr([...])`` of the strings of a map's output (a spread OpSpec; mutates the
        pending fragment)."""
        return self._op("repr_list", [mapped], spread=True)

    def text_op(
        self,
        op: TextOpKind,
        items: Iterable[str | SemanticVariable],
        *,
        path: Sequence[str | int] = (),
        args: Sequence[str | int | None] = (),
    ) -> SemanticVariable:
        """A variable the server computes with one of the protocol's text ops (``strip``,
        ``json_field``, ``index``...: OpSpec, docs/protocol.md), each Python's own
        operation on the items' texts. Mutates the pending fragment; ValueError (pydantic's)
        for an arity or argument the op does not take."""
        return self._op(op, items, path=list(path), args=list(args))

    def _op(
        self,
        op: Literal["join", "repr_list"] | TextOpKind,
        items: Iterable[str | SemanticVariable],
        spread: bool = False,
        **params: Any,
    ) -> SemanticVariable:
        inputs = [self.variable(item) if isinstance(item, str) else item for item in items]
        for item in inputs:
            self.check_owned(item)
        output = self.new_variable(name=op)
        spec = OpSpec(
            id=self.new_id("o"),
            op=op,
            inputs=[v.id for v in inputs],
            output=output.id,
            spread=spread,
            **params,
        )
        self.declare([VarSpec(id=output.id, name=op)], op=spec)
        return output

    # -- building blocks for functions.py and adapters ------------------------------------

    def new_id(self, prefix: str) -> str:
        """A session-unique id (``v17``, ``c18``...). Mutates the id counter."""
        return self._pending.new_id(prefix)

    def new_variable(self, name: str | None = None, value: str | None = None) -> SemanticVariable:
        """A SemanticVariable with a fresh id, registered for routing but NOT declared to the
        server (the caller declares it). Mutates the registry."""
        var = SemanticVariable(self._session, self.new_id("v"), name, value)
        with self._vars_lock:
            self._vars[var.id] = var
        # Once the caller drops the variable, nothing can mention its id again: everything
        # that references it is already in the pending fragment or shipped.
        finalizer = weakref.finalize(var, self._released.append, var.id)
        finalizer.atexit = False  # at interpreter exit there is no session left to tell
        return var

    def take_released(self, limit: int) -> list[str]:
        """Up to ``limit`` ids of dropped variables, oldest first (mutates: removes them)."""
        taken: list[str] = []
        while self._released and len(taken) < limit:
            taken.append(self._released.popleft())
        self._wiring.forget(taken)
        with self._vars_lock:
            for var_id in taken:
                self._producers.pop(var_id, None)
                self._map_locals.pop(var_id, None)
        return taken

    def declare(
        self,
        vars: Sequence[VarSpec],
        call: CallSpec | None = None,
        op: OpSpec | None = None,
        map: MapSpec | None = None,
        switch: SwitchSpec | None = None,
    ) -> None:
        """Appends declarations to the pending fragment atomically and records who reads
        what and who produces what (mutates). Raises ConnectionError once the session is
        closed."""
        closed = self._closed_reason()
        if closed is not None:
            raise ConnectionError(f"session is closed: {closed}")
        self._wiring.note(call, op, map)  # first: a reader is known before it can be shipped
        self._note_producers(call, op, map)
        self._pending.add(vars, call, op, map, switch)

    def _note_producers(
        self, call: CallSpec | None, op: OpSpec | None, map: MapSpec | None
    ) -> None:
        outputs: list[tuple[str, str]] = []
        if call is not None and call.segments is not None:
            outputs += [(s.gen, call.id) for s in call.segments if isinstance(s, GenSegment)]
        elif call is not None:
            outputs += [(call.bind[name], call.id) for name in call.sampling]
        if op is not None:
            outputs.append((op.output, op.id))
        if map is not None:
            outputs += [(v, map.id) for v in (map.output, *map.step_outputs)]
        with self._vars_lock:
            self._producers.update(outputs)

    def check_owned(self, var: SemanticVariable, builder: str | None = None) -> None:
        """ValueError unless ``var`` belongs to this session and may be read here: a map
        step's local output only by later steps of its own builder, ``builder`` (pure)."""
        if var.session is not self:
            raise ValueError(f"{var!r} belongs to another session")
        owner = self._map_locals.get(var.id)
        if owner is not None and owner != builder:
            raise ValueError(
                f"{var!r} is the output of a step of map_steps builder {owner!r}: only that "
                "builder's later steps may read it (a map's result is what map returns)"
            )

    def mark_local(self, var: SemanticVariable, builder: str) -> None:
        """Marks ``var`` a local output of the MapSteps ``builder`` (mutates the registry)."""
        with self._vars_lock:
            self._map_locals[var.id] = builder

    def _lookup(self, var_id: str) -> SemanticVariable | None:
        with self._vars_lock:
            return self._vars.get(var_id)
