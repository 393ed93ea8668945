"""``SendEach``: a ``Send`` fan-out that can run on the server, as one map.

LangGraph's map-reduce routes with a function returning ``[Send(node, arg) for item in
state[...]]``. A Python function is opaque, so the compiler runs it on the client (a cut):
the list must be fetched first. :class:`SendEach` is that function written as data — it is
still an ordinary callable LangGraph runs eagerly — so the compiler knows what it does, and
when the list is a constrained JSON output (``with_structured_output`` whose schema makes
the field an array of strings with at least one item), the fan-out becomes a server-side
map (docs/protocol.md, MapSpec): per element, the target node's calls as a pipeline (each
step may read the element, the kept state and the earlier steps' replies), where the list
is, with no client round trip. Anything it cannot prove equal to the eager run (see
:func:`lower_send_each`) falls back to the client cut, which is always exact.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.runnables import RunnableConfig
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.types import Send

from eclectus.adapters.client import Gen
from eclectus.adapters.client.map_steps import MapSteps
from eclectus.adapters.client.variables import VarState
from eclectus.adapters.langchain.compiler.callbacks import CallRecord, fire_one, wanted
from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.compiler.registry import lower
from eclectus.adapters.langchain.compiler.symbols import SymParsed, collect_refs
from eclectus.adapters.langchain.pieces import Piece, Ref, Spread, SymMessage, Value
from eclectus.adapters.langgraph.support import is_python_node
from eclectus.protocol import MAX_MAP_STEPS, SamplingParams

if TYPE_CHECKING:
    from eclectus.adapters.langgraph.executor import GraphRun


class SendEach:
    """A conditional-edge path: one ``Send(node, {key: item, **kept})`` per item of the
    list at ``state[over]`` (then ``path``: keys into a dict, fields of a model), where
    ``kept`` is ``{k: state[k] for k in keep}``. Immutable; pure to call."""

    def __init__(
        self, node: str, over: str, *, key: str, path: Sequence[str] = (), keep: Sequence[str] = ()
    ) -> None:
        self.node, self.over, self.key = node, over, key
        self.path, self.keep = tuple(path), tuple(keep)
        self.__name__ = f"send_each_{node}"

    def __call__(self, state: dict[str, Any]) -> list[Send]:
        kept = {k: state[k] for k in self.keep}
        return [Send(self.node, {**kept, self.key: item}) for item in self.items(state)]

    def items(self, state: dict[str, Any]) -> list[Any]:
        """The list the fan-out is over (pure)."""
        value = state[self.over]
        for key in self.path:
            value = value[key] if isinstance(value, dict) else getattr(value, key)
        return list(value)


@dataclass(frozen=True, slots=True)
class MapRecord:
    """A declared map, for its calls' callbacks: the node's calls as the lowering recorded
    them (over ``element`` and the earlier calls' map-local replies), the plan variable and
    path, the map's output (the last call's replies) and ``steps``, the SDK variables of
    the earlier calls' replies (JSON arrays, element order; empty without handlers)."""

    calls: tuple[CallRecord, ...]
    element: Ref
    items: Any  # the SDK variable holding the plan's JSON
    path: tuple[str, ...]
    mapped: Any  # the SDK variable holding the JSON array of the last call's replies
    steps: tuple[Any, ...] = ()


@dataclass(slots=True)
class MapTask:
    """Stands for every ``Send`` task of a fan-out run as one server map: the tasks' writes
    together are ``update`` (``{key: [Spread]}``, the reducer concatenates them)."""

    node: str
    update: dict[str, list[Any]]


class NotMappable(Exception):
    """The fan-out cannot be a server map exactly; it runs as a client cut."""


async def lower_send_each(run: GraphRun, fan: SendEach, state: dict[str, Any]) -> MapTask | None:
    """The fan-out as one server map (declared on ``run.ctx``), or None when it must be a
    client cut: the list is not a constrained JSON output whose schema makes it a non-empty
    array of strings; the target is a Python node, has conditional edges, or does not lower
    to 1..MAX_MAP_STEPS calls, the last one's reply written as ``[reply]`` to an
    ``operator.add`` key, each call reading only the element, the kept state, constants and
    the earlier calls' replies. With callbacks, the map's calls fire theirs once the run's
    values are back (:func:`fire_maps`)."""
    source = state.get(fan.over)
    target = run.builder.nodes.get(fan.node)
    if not isinstance(source, SymParsed) or target is None or is_python_node(target.runnable):
        return None
    if source.path:  # one field of a split output (routing.split_fields): the cut, as ever
        return None
    if run.builder.branches.get(fan.node):
        return None
    if any(k not in state for k in fan.keep) or not _string_list(source, fan.path):
        return None
    try:
        return await _declare_map(run, fan, source, {k: state[k] for k in fan.keep})
    except NotMappable:
        return None


def _string_list(source: SymParsed, path: Sequence[str]) -> bool:
    """Whether the parsed value at ``path`` is, by the schema, a non-empty list of
    strings, and the parser hands it over unchanged (pure)."""
    parser, schema = source.parser, source.schema
    if isinstance(parser, PydanticOutputParser):
        decorators = parser.pydantic_object.__pydantic_decorators__
        if len(path) > 1 or decorators.field_validators or decorators.model_validators:
            return False
    elif type(parser) is not JsonOutputParser:
        return False
    for key in path:
        if not isinstance(schema, dict) or schema.get("type") != "object":
            return False
        if key not in schema.get("required", ()):
            return False
        schema = schema.get("properties", {}).get(key)
    return isinstance(schema, dict) and _strings(schema) and int(schema.get("minItems", 0)) >= 1


def _strings(schema: dict[str, Any]) -> bool:
    """An array schema whose items are strings, at most length- or pattern-bounded: any
    such item binds as its text, so the parser hands the eager run the same strings (pure)."""
    items = schema.get("items")
    return (
        schema.get("type") == "array"
        and isinstance(items, dict)
        and items.get("type") == "string"
        and set(items) <= {"type", "title", "description", "minLength", "maxLength", "pattern"}
    )


async def _declare_map(
    run: GraphRun, fan: SendEach, source: SymParsed, kept: dict[str, Any]
) -> MapTask:
    """Lowers the target node over a map-local ``element`` into a builder of steps (no
    I/O), checks what it writes, then declares the map (mutates the pending fragment and
    ``run.maps``). NotMappable, with nothing declared, for any other shape."""
    ctx = run.ctx
    session = ctx.session.session
    element = session.new_variable(name="element")
    capture = _Capture(ctx.session, ctx.server, ctx.mode, ctx.config, timeout=ctx.timeout)
    capture.steps = session.map_steps(element)
    element_ref = Ref(element)
    node = run.builder.nodes[fan.node].runnable
    output = await lower(node, {**kept, fan.key: element_ref}, capture)
    if not capture.replies or not isinstance(output, dict) or len(output) != 1:
        raise NotMappable("the node is not calls writing one key")
    ((key, value),) = output.items()
    channel = run.builder.channels.get(key)
    if not (isinstance(value, list) and len(value) == 1 and value[0] is capture.replies[-1]):
        raise NotMappable("the node does not write [its last call's reply]")
    if not (isinstance(channel, BinaryOperatorAggregate) and channel.operator is operator.add):
        raise NotMappable(f"state key {key!r} does not concatenate")
    calls = tuple(capture.calls)
    assert len(calls) == len(capture.replies)  # lower_model records each call it declares
    callbacks = len(calls) > 1 and wanted(list(calls), ctx.config)
    mapped, steps = session.map_pipeline(
        source.ref.var, capture.steps, items_path=fan.path, step_outputs=callbacks
    )
    record = MapRecord(calls, element_ref, source.ref.var, fan.path, mapped, tuple(steps))
    run.maps.append(record)
    where = ".".join((fan.over, *fan.path))
    what = "one call" if len(calls) == 1 else f"a pipeline of {len(calls)} calls"
    ctx.trace.op(f"map over {where}: {what} of {fan.node!r} per item, on the server")
    return MapTask(fan.node, {key: [Spread(Ref(mapped))]})


def _text(piece: Piece) -> str:
    return piece.text if isinstance(piece, Value) else str(piece)


@dataclass(slots=True)
class _Capture(Lowering):
    """A lowering that declares nothing on the session: each call the map's node makes
    becomes a step of ``steps`` (the SDK's map builder, no I/O) whose reply is a map-local
    variable, and anything else is refused (mutated by declare_call)."""

    steps: MapSteps | None = None  # the SDK's builder, set before lowering
    replies: list[Ref] = field(default_factory=list)  # each step's reply, in order

    def declare_call(
        self,
        pieces: Sequence[Piece],
        sampling: SamplingParams,
        model: str | None,
        label: str,
        add_special_tokens: bool = True,
    ) -> Ref:
        if len(self.replies) >= MAX_MAP_STEPS:
            raise NotMappable(f"a node with more than {MAX_MAP_STEPS} calls")
        assert self.steps is not None
        parts: list[Any] = [p.var if isinstance(p, Ref) else _text(p) for p in pieces]
        try:
            reply = self.steps.call(
                [*parts, Gen(sampling=sampling)], model=model, add_special_tokens=add_special_tokens
            )
        except ValueError as exc:  # a piece the map cannot read: never a wrong result
            raise NotMappable(str(exc)) from exc
        self.replies.append(Ref(reply))
        return self.replies[-1]

    def repr_list(self, items: list[Any]) -> Ref:
        raise NotMappable("a server op inside the node")

    async def resolve(self, value: Any, extra: Sequence[Any] = ()) -> Any:
        if not collect_refs(value, []) and not extra:
            return value
        raise NotMappable("the node needs a value on the client")

    async def cut(self, runnable: Any, value: Any, reason: str) -> Any:
        raise NotMappable(f"a client cut inside the node ({reason})")


def map_vars(maps: list[MapRecord], config: RunnableConfig) -> list[Any]:
    """The SDK variables :func:`fire_maps` needs, when a handler wants the maps' calls
    ([] otherwise), for the run's final frame (pure)."""
    if not maps or not wanted([c for m in maps for c in m.calls], config):
        return []
    local = {id(r.var) for m in maps for c in m.calls for r in (m.element, c.ref)}
    inputs = [
        r.var
        for m in maps
        for c in m.calls
        for r in collect_refs(c.input, [])
        if id(r.var) not in local
    ]
    outputs = [v for m in maps for v in (m.items, *m.steps, m.mapped)]
    return list(dict.fromkeys([*outputs, *inputs]))


async def fire_maps(maps: list[MapRecord], config: RunnableConfig, mode: str) -> None:
    """Fires each finished map's calls' callbacks as the eager ``Send`` tasks fire them:
    per item, its calls in order (start with the messages, end with the reply; the server
    reports no per-instance usage, so the replies have no ``usage_metadata``). No-op
    without handlers."""
    if not maps or not wanted([c for m in maps for c in m.calls], config):
        return
    for record in maps:
        if record.mapped.state is not VarState.READY:
            continue  # the map failed: the run raises; no call fired eagerly either
        items = json.loads(record.items.value or "")  # the server parsed it already
        for key in record.path:
            items = items[key]
        # per call, its replies in element order: the earlier calls' from ``steps``
        replies = [json.loads(v.value or "[]") for v in (*record.steps, record.mapped)]
        if len(replies) != len(record.calls):
            continue  # no step outputs came back (none asked for): nothing to replay
        for i, item in enumerate(items):
            texts = {id(record.element.var): item}
            for call, outputs in zip(record.calls, replies, strict=True):
                texts[id(call.ref.var)] = outputs[i]
            for call in record.calls:
                await _fire_step(call, config, mode, texts)


async def _fire_step(
    call: CallRecord, config: RunnableConfig, mode: str, texts: dict[int, str]
) -> None:
    """One map instance's call: ``texts`` holds the map-local values by ``id(var)``
    (the element, the calls' replies); outer variables are final by now."""
    table = {
        id(ref): texts.get(id(ref.var), ref.var.value)
        for ref in collect_refs(call.input, [])
        if id(ref.var) in texts or ref.var.state is VarState.READY
    }
    assert isinstance(call.output, SymMessage)
    output = SymMessage(Ref(_Reply(texts[id(call.ref.var)])), call.output.model_name)
    await fire_one(replace(call, output=output), config, mode, table)


@dataclass(frozen=True, slots=True)
class _Reply:
    """What callbacks read of a map instance's reply: a final text, no usage."""

    value: str
    state: VarState = VarState.READY
    usage: None = None
    finish_reason: None = None
    error: None = None
