"""Maps: a fan-out on the server, one call per element of a JSON array variable.

A map node (``Node.map``) waits like any node for its inputs: the ``items`` variable and the
template call's other inputs. When they are final, :func:`advance` *expands* it: it parses
the items, adds one call per element (ids ``{map}#{i}``, the element as a constant variable
``{map}#{i}.element``, the output ``{map}#{i}.out``, all released at birth so they are
freed once the map is done), activates them with the map's objective and one task group,
and makes those outputs the map node's inputs. When they are all final, :func:`advance`
returns the map's output text, the JSON array of the instances' outputs. A failed instance
fails the map (it consumes the instance's output), and so everything downstream.

Nothing here awaits or knows the scheduler: the graph calls :func:`advance` from its settle
loop and queues the calls that come back ready.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from eclectus.protocol import ErrorCode, GenSegment, MapSpec, Segment, VarSegment
from eclectus.server.config import ServerConfig
from eclectus.server.errors import GraphError

if TYPE_CHECKING:
    from eclectus.server.graph import Graph, Node


@dataclass(slots=True)
class MapPlan:
    """What a map node needs to expand: the spec, its call's segments, and the limits."""

    spec: MapSpec
    segments: tuple[Segment, ...]  # the template call's prompt, ``element`` still unbound
    max_items: int
    max_element_bytes: int
    max_calls: int  # the session's max_calls_per_session
    max_vars: int  # the session's max_vars_per_session
    instances: list[str] = field(default_factory=list)  # instance node ids once expanded

    @property
    def expanded(self) -> bool:
        return bool(self.instances)


class MapFailed(Exception):
    """A map cannot expand; the graph fails its node with ``code``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def stage_map(
    spec: MapSpec, segments: tuple[Segment, ...], where: str, config: ServerConfig
) -> Node:
    """The map node of ``spec`` (pure); GraphError when its call is not a one-output call.
    Returns a ``Node`` whose inputs are ``items`` and the call's other inputs."""
    from eclectus.server.graph import Node

    outputs = [s.gen for s in segments if isinstance(s, GenSegment)]
    if len(outputs) != 1:
        raise GraphError(
            "bad_request", "a map's call needs exactly one output", field=f"{where}.call"
        )
    if spec.element in (spec.items, spec.output):
        raise GraphError("bad_request", "a map's element must be a name of its own", field=where)
    inputs = [s.var for s in segments if isinstance(s, VarSegment) and s.var != spec.element]
    plan = MapPlan(
        spec,
        segments,
        config.max_map_items,
        config.max_map_element_bytes,
        config.max_calls_per_session,
        config.max_vars_per_session,
    )
    node_inputs = tuple(dict.fromkeys([spec.items, *inputs]))
    return Node(spec.id, node_inputs, (spec.output,), model=spec.call.model, map=plan)


def parse_items(text: str, path: Sequence[str] = ()) -> list[object]:
    """The elements of a map's items text: a JSON array, optionally inside a markdown
    ```` ```json ```` fence, or the array at ``path`` (object keys) inside it (pure).
    MapFailed ``bad_request`` otherwise."""
    body = text.strip()
    if body.startswith("```"):
        body = body.removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        items = json.loads(body)
    except json.JSONDecodeError as exc:
        raise MapFailed("bad_request", f"items are not JSON: {exc}") from None
    for i, key in enumerate(path):
        if not isinstance(items, dict) or key not in items:
            where = "".join(f"[{k!r}]" for k in path[:i])
            raise MapFailed("bad_request", f"items{where} has no key {key!r}")
        items = items[key]
    if not isinstance(items, list):
        raise MapFailed("bad_request", f"items are a JSON {type(items).__name__}, not an array")
    return items


def element_text(element: object) -> str:
    """The text an element binds: a string's value, any other value's compact JSON (pure)."""
    if isinstance(element, str):
        return element
    return json.dumps(element, ensure_ascii=False, separators=(",", ":"))


def advance(graph: Graph, node: Node) -> list[Node] | str:
    """Move a map whose inputs are final on (mutates ``graph``): expand it (returns the new
    instance calls, WAITING, for the caller to settle), or, once expanded, its output text.
    MapFailed when it cannot expand."""
    plan = node.map
    assert plan is not None
    if plan.expanded:
        return json.dumps([graph.vars[v].value or "" for v in node.inputs], ensure_ascii=False)
    items = parse_items(graph.vars[plan.spec.items].value or "", plan.spec.items_path)
    if not items:
        node.inputs = ()
        return "[]"
    _check_limits(graph, plan, items)
    return _expand(graph, node, plan, [element_text(e) for e in items])


def _check_limits(graph: Graph, plan: MapPlan, items: list[object]) -> None:
    num = len(items)
    if num > plan.max_items:
        raise MapFailed("limit_exceeded", f"{num} items, limit max_map_items={plan.max_items}")
    for i, element in enumerate(items):
        size = len(element_text(element).encode())
        if size > plan.max_element_bytes:
            raise MapFailed(
                "limit_exceeded",
                f"element {i} has {size} bytes, limit max_map_element_bytes="
                f"{plan.max_element_bytes}",
            )
    if len(graph.nodes) + num > plan.max_calls:
        raise MapFailed(
            "limit_exceeded",
            f"{num} instances would exceed max_calls_per_session={plan.max_calls}",
        )
    if len(graph.vars) + 2 * num > plan.max_vars:
        raise MapFailed(
            "limit_exceeded",
            f"{num} instances would exceed max_vars_per_session={plan.max_vars}",
        )


def _expand(graph: Graph, node: Node, plan: MapPlan, texts: list[str]) -> list[Node]:
    from eclectus.server.graph import Node, NodeState, Variable, VarState

    spec = plan.spec
    variables: list[Variable] = []
    instances: list[Node] = []
    for i, text in enumerate(texts):
        node_id, element_id = f"{spec.id}#{i}", f"{spec.id}#{i}.element"
        output_id = f"{spec.id}#{i}.out"
        taken = [v for v in (element_id, output_id) if v in graph.vars]
        if taken or node_id in graph.nodes:
            raise MapFailed("duplicate_var", f"instance id {taken or node_id!r} is in use")
        variables.append(Variable(element_id, value=text, state=VarState.READY, released=True))
        variables.append(Variable(output_id, released=True))
        segments = tuple(_bind(s, spec.element, element_id, output_id) for s in plan.segments)
        inputs = tuple(dict.fromkeys(s.var for s in segments if isinstance(s, VarSegment)))
        instance = Node(node_id, inputs, (output_id,), segments=segments, model=node.model)
        instance.objective, instance.arrival = node.objective, node.arrival
        instance.group = f"map/{id(graph)}/{spec.id}"
        instance.state = NodeState.WAITING
        instances.append(instance)
    graph.add(variables, instances)
    plan.instances = [n.node_id for n in instances]
    node.inputs = tuple(n.outputs[0] for n in instances)
    for var_id in node.inputs:
        graph.vars[var_id].consumers[node.node_id] = None
    return instances


def _bind(segment: Segment, element: str, element_id: str, output_id: str) -> Segment:
    if isinstance(segment, VarSegment) and segment.var == element:
        return VarSegment(var=element_id)
    if isinstance(segment, GenSegment):
        return GenSegment(gen=output_id, sampling=segment.sampling)
    return segment
