"""Routing on the server: a router over a constrained ``choice`` becomes a switch.

A supervisor's router node writes one of N literals (a call constrained to a ``choice``,
``extra_body={"structured_outputs": {"choice": [...]}}`` or vLLM's ``guided_choice``) to a
state key, and a conditional edge maps it to the next node. The common LangGraph router —
a node ``prompt | model.with_structured_output(Router)`` whose dict output is merged into
the state, ``Router`` a TypedDict with ``next: Literal[...]`` — is one too: its reply is
constrained to a JSON Schema pinning ``next`` to an ``enum``, so :func:`split_fields` keeps
each field symbolic under its state key and the switch routes on that field (a SwitchSpec
``path``); so is a Pydantic ``Router`` whose parse provably keeps the field (model_routes).
The edge function is Python,
but it is deterministic and sees only N possible values, so the client evaluates it ahead
of time for each literal (:func:`switch_point`), on a state where every key it does not
know yet raises. When each literal leads to known node names (or the end), the run *forks*:
the rest of the graph is lowered once per literal, each branch's calls guarded by that
literal in one protocol switch (docs/protocol.md, SwitchSpec). The server runs the router,
then only the taken branch; the others are skipped, never dispatched. No client round trip.

A fork is speculation, so it must be free to give up: a branch that needs the client (a
Python node, a router that is no switch, a reducer over values), a router that loops back,
more than :data:`MAX_FORK_RUNS` branch runs or nesting over ``MAX_SWITCH_DEPTH`` raise
:class:`NotSwitchable`; the outermost fork then takes its declarations back
(``Session.retract``) and the edge runs as a client cut, as before. Never a different
result: the cut is what eager LangGraph does.

The run's output is then a :class:`Chosen` tree: each branch's symbolic output under the
router's variable. :func:`settle` fetches every branch's values in one frame (the skipped
ones answer ``skipped``), walks the tree by the routers' values and returns the taken
leaf, its calls and maps joining the run's (for callbacks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from langchain_core.output_parsers import JsonOutputParser
from langgraph.constants import END, START
from langgraph.types import Send

from eclectus.adapters.langchain.compiler.callbacks import CallRecord, pending_vars
from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.compiler.graph import GraphTrace
from eclectus.adapters.langchain.compiler.symbols import SymParsed, collect_refs, rebuild
from eclectus.adapters.langchain.pieces import Piece, Ref
from eclectus.adapters.langgraph.fanout import MapRecord, map_vars
from eclectus.adapters.langgraph.model_routes import (
    field_literals,
    field_value,
    known_model,
    literal_of,
    routed_field,
    split_model,
)
from eclectus.protocol import MAX_SWITCH_CASES, MAX_SWITCH_DEPTH, SamplingParams
from eclectus.protocol.schema_enum import NotPinned, pinned_literals

if TYPE_CHECKING:
    from eclectus.adapters.langgraph.executor import GraphRun, Task

MAX_FORK_RUNS = 32  # branch runs one top-level fork may lower before it gives up

RouteKey = tuple[str, tuple[str, ...]]  # a router's variable id, and the path into its JSON


class NotSwitchable(Exception):
    """A fork cannot finish on the server; its router runs as a client cut."""


class _Unknown(Exception):
    """The routing function read a state key whose value the client does not know."""


@dataclass(frozen=True, slots=True)
class SwitchPoint:
    """A router that may run on the server: the key and ref it routes on, and each
    literal's destinations (node names or END)."""

    source: str  # the node the conditional edge leaves
    key: str
    route: Ref
    cases: dict[str, list[str]]
    path: tuple[str, ...] = ()  # into the route's JSON reply (a structured router)
    parsed: SymParsed | None = None  # that field, as the state holds it


@dataclass(slots=True)
class Fork:
    """A superstep's next tasks, per literal of ``point.route``; ``fallback`` computes the
    tasks with the router run as a client cut instead."""

    point: SwitchPoint
    cases: dict[str, list[Task]]
    fallback: Any  # () -> Awaitable[list[Task]]


@dataclass(slots=True)
class Branch:
    """What one literal's run built: its symbolic output (maybe a nested :class:`Chosen`),
    and the call and map records, steps and declarations of its own."""

    output: Any
    calls: list[CallRecord]
    maps: list[MapRecord]
    steps: list[Any]
    own: list[Any]  # SDK variables of the nodes the branch declared (the switch's case)


@dataclass(slots=True)
class Chosen:
    """A run's output that the server chooses: one :class:`Branch` per literal of
    ``route``."""

    route: Ref
    cases: dict[str, Branch]
    parsed: SymParsed | None = None  # a structured router's field (the literal is in JSON)


class _KnownState(Mapping[str, Any]):
    """The state a routing function sees ahead of time: ``known`` values as they are, the
    router's key as one literal; reading any other value holding a ref raises
    :class:`_Unknown` (keys themselves are known)."""

    def __init__(self, state: Mapping[str, Any], known: Mapping[RouteKey, str]) -> None:
        self._state = state
        self._known = known

    def __getitem__(self, key: str) -> Any:
        value = self._state[key]
        field = _routed(value)
        route = _route_key(field)
        if route is not None and route in self._known:
            literal = self._known[route]
            if field is not value:  # a whole Pydantic model: only the routed field known
                return known_model(field, literal)
            if isinstance(field, SymParsed) and type(field.parser) is not JsonOutputParser:
                return field_value(field, literal)  # a model's field: maybe an Enum member
            return literal
        if collect_refs(value, []):
            raise _Unknown(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


def switch_point(
    run: GraphRun, source: str, branch: Any, state: Mapping[str, Any]
) -> SwitchPoint | list[str] | None:
    """The router of ``branch`` (leaving node ``source``) evaluated ahead of time when the
    state holds a router's constrained reply: a :class:`SwitchPoint`, the destinations
    when they do not depend on the literal (or an enclosing fork decided it), or None when
    it must be a client cut (pure but for calling the routing function once per literal,
    directly: it must be deterministic and free of side effects, as LangGraph asks of
    routers; no chain callbacks fire for it)."""
    func = getattr(branch.path, "func", None)
    choice = next(
        (
            (k, v, lits)
            for k, v in state.items()
            if (lits := _literals(run, _routed(v))) is not None
        ),
        None,
    )
    if func is None or getattr(branch.path, "func_accepts", None):
        if choice is not None:  # an async-only router, or one taking config, store...
            _note(run, source, "the router is not a plain function of the state")
        return None
    known = run.known
    if choice is None:
        return None  # a router over anything else: the cut, as ever
    key, whole, literals = choice
    value = _routed(whole)
    route_key = _route_key(value)
    assert route_key is not None
    if route_key in known:  # decided by an enclosing fork (a branch cannot cut)
        return _evaluate(run, func, branch, _KnownState(state, known))
    route = value.ref if isinstance(value, SymParsed) else value
    if isinstance(run.ctx, ForkLowering) and not any(v is route.var for v in run.ctx.own):
        # a nested switch must route on a reply of its own branch: then it is skipped with
        # the branch (its router is); on an older reply its taken case would run anyway
        _note(run, source, "inside a branch, it routes on a reply from outside the branch")
        return None
    if len(literals) > MAX_SWITCH_CASES:
        _note(run, source, f"over {MAX_SWITCH_CASES} literals")
        return None
    cases: dict[str, list[str]] = {}
    for literal in literals:
        dests = _evaluate(run, func, branch, _KnownState(state, {**known, route_key: literal}))
        if dests is None:
            why = f"for {literal!r} it reads state the client does not know, or routes to a Send"
            _note(run, source, why)
            return None
        cases[literal] = dests
    if len({tuple(d) for d in cases.values()}) == 1:
        return next(iter(cases.values()))
    if _loops_back(run, source, [d for ds in cases.values() for d in ds]):
        _note(run, source, "a branch loops back to the router")
        return None
    if isinstance(value, SymParsed):
        return SwitchPoint(source, key, route, cases, value.path, value)
    return SwitchPoint(source, key, route, cases)


def split_fields(output: SymParsed, channels: Mapping[str, Any]) -> dict[str, SymParsed] | None:
    """A structured reply parsed to a dict, as one symbolic field per state key, when the
    schema fixes the dict's keys: a plain JSON parser, an object whose every property is
    required, and no other key that names a state channel possible. The engine compiles a
    schema in xgrammar's strict mode (no property outside ``properties`` unless
    ``additionalProperties`` allows it), so only a schema allowing more keys, while some
    channel lies outside the properties, is refused. A Pydantic model's fields are split
    as LangGraph writes them (:func:`~.model_routes.split_model`). None otherwise (the
    whole value is then resolved, as before). Pure."""
    schema = output.schema
    if type(output.parser) is not JsonOutputParser:
        return split_model(output, channels)  # a Pydantic router's model (model_routes)
    if output.path or not isinstance(schema, dict):
        return None
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, dict) or not properties:
        return None
    if set(properties) - set(schema.get("required", ())):
        return None  # a key the reply may leave out: the eager state would lack it
    extra = schema.get("additionalProperties", False) is not False or "patternProperties" in schema
    if extra and set(channels) - set(properties):
        return None  # an extra key naming a channel would write it eagerly
    return {key: replace(output, path=(key,)) for key in properties}


def _literals(run: GraphRun, value: Any) -> tuple[str, ...] | None:
    """The literals ``value`` is one of by construction: a call's ``choice``, or a field a
    JSON Schema pins to an ``enum`` (pure); None for any other value."""
    if isinstance(value, Ref):
        return run.ctx.choices.get(value.var.id)
    if isinstance(value, SymParsed) and value.path and value.schema is not None:
        if type(value.parser) is not JsonOutputParser:
            return field_literals(value)  # a Pydantic model's field, when provably exact
        try:
            return pinned_literals(value.schema, value.path)
        except NotPinned:
            return None
    return None


def _routed(value: Any) -> Any:
    """What a state value routes on: a whole Pydantic model's routed field, else the
    value itself (pure)."""
    return routed_field(value) or value


def _route_key(value: Any) -> RouteKey | None:
    """The key a router's value is known by in a branch (pure)."""
    if isinstance(value, Ref):
        return (value.var.id, ())
    if isinstance(value, SymParsed) and value.path:
        return (value.ref.var.id, value.path)
    return None


def _note(run: GraphRun, source: str, reason: str) -> None:
    run.ctx.trace.node(f"router after {source!r}: no server switch ({reason})")


def _evaluate(run: GraphRun, func: Any, branch: Any, state: _KnownState) -> list[str] | None:
    """The router's destinations on ``state``, when all are node names or END (pure)."""
    try:
        result = func(state)
    except Exception:  # unknown state, or the router's own error: the cut reproduces it
        return None
    results = list(result) if isinstance(result, list | tuple) else [result]
    dests: list[str] = []
    for item in results:
        if isinstance(item, Send) or not isinstance(item, str):
            return None
        if branch.ends:
            if item not in branch.ends:
                return None
            item = branch.ends[item]
        if item != END and (item == START or item not in run.builder.nodes):
            return None
        dests.append(item)
    return dests


def _loops_back(run: GraphRun, source: str, dests: list[str]) -> bool:
    """Whether ``source`` is reachable from ``dests`` (a loop a fork would unroll without
    end); a router without a path map may go anywhere, so it counts as a loop (pure)."""
    seen: set[str] = set()
    stack = [d for d in dests if d != END]
    while stack:
        node = stack.pop()
        if node == source:
            return True
        if node in seen:
            continue
        seen.add(node)
        stack.extend(end for start, end in run.builder.edges if start == node and end != END)
        for branch in run.builder.branches.get(node, {}).values():
            if not branch.ends:
                return True
            stack.extend(e for e in branch.ends.values() if e != END)
    return False


@dataclass(slots=True)
class ForkBudget:
    """Branch runs left to one top-level fork, and what its branches declared (so giving
    up takes it all back). Mutated as branches run."""

    runs_left: int = MAX_FORK_RUNS
    outputs: list[Any] = field(default_factory=list)  # SDK variables of declared nodes
    switches: list[str] = field(default_factory=list)  # ids of nested switches


@dataclass(slots=True)
class ForkLowering(Lowering):
    """A branch's lowering: it declares as usual but records what it declared (the
    switch guards it), and refuses anything that needs the client (NotSwitchable)."""

    own: list[Any] = field(default_factory=list)  # SDK variables this branch's nodes produce
    budget: ForkBudget = field(default_factory=ForkBudget)

    @classmethod
    def of(cls, ctx: Lowering, budget: ForkBudget) -> ForkLowering:
        """A branch context sharing ``ctx``'s session, config and choices, with its own
        trace, call records and declarations (pure)."""
        shared = {f.name: getattr(ctx, f.name) for f in fields(Lowering)}
        shared.update(trace=GraphTrace(), calls=[])
        return cls(**shared, budget=budget)

    def declare_call(
        self,
        pieces: Sequence[Piece],
        sampling: SamplingParams,
        model: str | None,
        label: str,
        add_special_tokens: bool = True,
    ) -> Ref:
        ref = Lowering.declare_call(self, pieces, sampling, model, label, add_special_tokens)
        self.note(ref.var)
        return ref

    def repr_list(self, items: list[Any]) -> Ref:
        ref = Lowering.repr_list(self, items)
        self.note(ref.var)
        return ref

    def note(self, output: Any) -> None:
        """``output``'s producer belongs to this branch (mutates)."""
        self.own.append(output)
        self.budget.outputs.append(output)

    async def resolve(self, value: Any, extra: Any = ()) -> Any:
        if not collect_refs(value, []) and not extra:
            return value
        raise NotSwitchable("a value the client would need inside a branch")

    async def cut(self, runnable: Any, value: Any, reason: str) -> Any:
        raise NotSwitchable(f"a client cut inside a branch ({reason})")


async def fork(run: GraphRun, point: Fork, step: int, budget: ForkBudget) -> Chosen:
    """Lower the rest of the graph once per literal and guard each branch with one switch
    (declared on ``run.ctx``); the :class:`Chosen` output. NotSwitchable when a branch
    cannot finish on the server (the caller falls back to the cut)."""
    if run.depth >= MAX_SWITCH_DEPTH:
        raise NotSwitchable(f"switches nested over {MAX_SWITCH_DEPTH} deep")
    route = point.point.route
    cases: dict[str, Branch] = {}
    traces: list[tuple[str, GraphTrace]] = []
    for literal, tasks in point.cases.items():
        budget.runs_left -= 1
        if budget.runs_left < 0:
            raise NotSwitchable(f"over {MAX_FORK_RUNS} branch runs")
        ctx = ForkLowering.of(run.ctx, budget)
        child = run.child(ctx, budget, (route.var.id, point.point.path), literal)
        try:
            output = await child.loop(tasks, step)
        except NotSwitchable:
            raise
        except Exception as exc:  # a branch the server might not take: only the cut knows
            raise NotSwitchable(f"case {literal!r} raised {type(exc).__name__}") from exc
        for record in child.maps:
            for var in (record.mapped, *record.steps):  # a step's outputs too, if any
                ctx.note(var)
        cases[literal] = Branch(output, ctx.calls, child.maps, child.steps, ctx.own)
        traces.append((literal, ctx.trace))
    session = run.ctx.session.session
    try:
        owned = {lit: b.own for lit, b in cases.items()}
        switch_id = session.switch(route.var, owned, path=point.point.path)
    except ValueError as exc:  # nothing the switch could guard: never a wrong result
        raise NotSwitchable(str(exc)) from exc
    budget.switches.append(switch_id)
    trace = run.ctx.trace
    trace.switched.append(point.point.source)
    with trace.nested(f"switch on {point.point.key!r}: the server takes one case, no cut"):
        for literal, branch_trace in traces:
            dests = ", ".join(point.point.cases[literal]) or END
            with trace.nested(f"case {literal!r} -> {dests}"):
                trace.merge(branch_trace)
    return Chosen(route, cases, point.point.parsed)


def give_up(run: GraphRun, budget: ForkBudget, reason: str) -> None:
    """Takes back what an abandoned fork declared (mutates the session's pending
    fragment) and notes why in the trace."""
    run.ctx.session.session.retract(budget.outputs, budget.switches)
    run.ctx.trace.node(f"no server switch ({reason})")


async def settle(ctx: Lowering, run: GraphRun, output: Chosen) -> Any:
    """The taken leaf of ``output`` (mutates ``ctx.calls``, ``run.maps`` and ``run.steps``
    with the taken branches' records): every branch's values, the routers' and what the
    callbacks need are fetched in one frame, skipped ones tolerated; a failure on the
    taken path raises as the run would."""
    wanted = [r.var for r in _leaf_refs(output)]
    calls = [c for b in _branches(output) for c in b.calls]
    maps = [m for b in _branches(output) for m in b.maps]
    wanted += pending_vars(calls, ctx.config) + map_vars(maps, ctx.config)
    wanted = list(dict.fromkeys(wanted))
    gets = ctx.session.session.aget_settled(
        wanted, ctx.objective.criteria, deadline_ms=ctx.objective.deadline_ms
    )
    await asyncio.wait_for(gets, ctx.timeout)
    node: Any = output
    while isinstance(node, Chosen):
        value = node.route.var.value
        if value is None:  # the router failed: raise its error as the run would
            await ctx.fetch([node.route.var])
        if node.parsed is not None:  # the field, parsed as eagerly (its error if no JSON)
            value = literal_of(rebuild(node.parsed, {id(node.parsed.ref): value}))
        if value not in node.cases:
            raise ValueError(f"the router's reply {value!r} is none of its literals")
        branch = node.cases[value]
        ctx.calls.extend(branch.calls)
        run.maps.extend(branch.maps)
        run.steps.extend(branch.steps)
        node = branch.output
    return node


def _branches(output: Any) -> Iterator[Branch]:
    if isinstance(output, Chosen):
        for branch in output.cases.values():
            yield branch
            yield from _branches(branch.output)


def _leaf_refs(output: Any) -> list[Ref]:
    if not isinstance(output, Chosen):
        return collect_refs(output, [])
    refs = [output.route]
    for branch in output.cases.values():
        refs += _leaf_refs(branch.output)
        refs += collect_refs([(s.values, s.updates) for s in branch.steps], [])
    return refs
