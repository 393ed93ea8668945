"""``SendEach``: a ``Send`` fan-out that can run on the server, as one map.

LangGraph's map-reduce routes with a function returning ``[Send(node, arg) for item in
state[...]]``. A Python function is opaque, so the compiler runs it on the client (a cut):
the list must be fetched first. :class:`SendEach` is that function written as data — it is
still an ordinary callable LangGraph runs eagerly — so the compiler knows what it does, and
when the list is a constrained JSON output (``with_structured_output`` whose schema makes
the field an array of strings with at least one item), the fan-out becomes a server-side
map (docs/protocol.md, MapSpec): one call per element, where the list is, with no client
round trip. Anything it cannot prove equal to the eager run (see :func:`lower_send_each`)
falls back to the client cut, which is always exact.
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
from eclectus.adapters.client.variables import VarState
from eclectus.adapters.langchain.compiler.callbacks import CallRecord, fire_one, wanted
from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.compiler.registry import lower
from eclectus.adapters.langchain.compiler.symbols import SymParsed, collect_refs
from eclectus.adapters.langchain.pieces import Piece, Ref, Spread, SymMessage, Value
from eclectus.adapters.langgraph.support import is_python_node
from eclectus.protocol import SamplingParams

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
    """A declared map, for its calls' callbacks: the node's one call as the lowering
    recorded it (over ``element``), the plan variable and path, the map's output."""

    call: CallRecord
    element: Ref
    items: Any  # the SDK variable holding the plan's JSON
    path: tuple[str, ...]
    mapped: Any  # the SDK variable holding the JSON array of the replies


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
    to exactly one call writing ``[its reply]`` to an ``operator.add`` key; or callbacks
    and the map's calls fire theirs once the run's values are back (:func:`fire_maps`)."""
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
    ctx = run.ctx
    session = ctx.session.session
    element = session.new_variable(name="element")
    capture = _Capture(ctx.session, ctx.server, ctx.mode, ctx.config, timeout=ctx.timeout)
    element_ref = Ref(element)
    node = run.builder.nodes[fan.node].runnable
    output = await lower(node, {**kept, fan.key: element_ref}, capture)
    if capture.call is None or not isinstance(output, dict) or len(output) != 1:
        raise NotMappable("the node is not one call writing one key")
    ((key, value),) = output.items()
    pieces, sampling, model, reply = capture.call
    channel = run.builder.channels.get(key)
    if not (isinstance(value, list) and len(value) == 1 and value[0] is reply):
        raise NotMappable("the node does not write [its reply]")
    if not (isinstance(channel, BinaryOperatorAggregate) and channel.operator is operator.add):
        raise NotMappable(f"state key {key!r} does not concatenate")
    parts: list[Any] = [p.var if isinstance(p, Ref) else _text(p) for p in pieces]
    mapped = session.map(
        source.ref.var,
        element,
        [*parts, Gen(sampling=sampling)],
        items_path=fan.path,
        model=model,
    )
    run.maps.append(MapRecord(capture.calls[0], element_ref, source.ref.var, fan.path, mapped))
    where = ".".join((fan.over, *fan.path))
    ctx.trace.op(f"map over {where}: one {fan.node!r} call per item, on the server")
    return MapTask(fan.node, {key: [Spread(Ref(mapped))]})


def _text(piece: Piece) -> str:
    return piece.text if isinstance(piece, Value) else str(piece)


@dataclass(slots=True)
class _Capture(Lowering):
    """A lowering that declares nothing: it records the one call a map's node makes (its
    output ref is a map-local name) and refuses anything else (mutated by declare_call)."""

    call: tuple[list[Piece], SamplingParams, str | None, Ref] | None = field(default=None)

    def declare_call(
        self, pieces: Sequence[Piece], sampling: SamplingParams, model: str | None, label: str
    ) -> Ref:
        if self.call is not None:
            raise NotMappable("a node with more than one call")
        reply = Ref(self.session.session.new_variable(name="reply"))
        self.call = (list(pieces), sampling, model, reply)
        return reply

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
    if not maps or not wanted([m.call for m in maps], config):
        return []
    inputs = [r.var for m in maps for r in collect_refs(m.call.input, []) if r is not m.element]
    return list(dict.fromkeys([*(m.items for m in maps), *(m.mapped for m in maps), *inputs]))


async def fire_maps(maps: list[MapRecord], config: RunnableConfig, mode: str) -> None:
    """Fires each finished map's calls' callbacks, one call per item, as the eager ``Send``
    tasks fire them (start with the messages, end with the reply; the server reports no
    per-instance usage, so the reply has no ``usage_metadata``). No-op without handlers."""
    if not maps or not wanted([m.call for m in maps], config):
        return
    for record in maps:
        if record.mapped.state is not VarState.READY:
            continue  # the map failed: the run raises; no call fired eagerly either
        items = json.loads(record.items.value or "")  # the server parsed it already
        for key in record.path:
            items = items[key]
        replies = json.loads(record.mapped.value or "[]")
        known = {
            id(ref): ref.var.value
            for ref in collect_refs(record.call.input, [])
            if ref is not record.element and ref.var.state is VarState.READY
        }
        assert isinstance(record.call.output, SymMessage)
        for item, reply in zip(items, replies, strict=True):
            output = SymMessage(Ref(_Reply(reply)), record.call.output.model_name)
            call = replace(record.call, output=output)
            await fire_one(call, config, mode, {**known, id(record.element): item})


@dataclass(frozen=True, slots=True)
class _Reply:
    """What callbacks read of a map instance's reply: a final text, no usage."""

    value: str
    state: VarState = VarState.READY
    usage: None = None
    finish_reason: None = None
    error: None = None
