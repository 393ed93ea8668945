"""Maps: a fan-out on the server, one call (or a pipeline of calls) per element of a JSON
array variable.

A map node (``Node.map``) waits like any node for its inputs: the ``items`` variable and the
steps' other inputs. When they are final, :func:`advance` *expands* it: it parses the items
and adds, per element, one call per step (step 0, ``call``: ids ``{map}#{i}`` and output
``{map}#{i}.out``; step k of ``then``: ``{map}#{i}.{k}`` and ``{map}#{i}.{k}.out``), the
element as a constant variable ``{map}#{i}.element``, all released at birth so they are
freed once the map is done. Step k reads step j < k through its output, and always runs
after step k-1 (that output is one of its inputs even unread), so a failed step fails the
instance's later steps. The calls get the map's objective, and one task group per step.
The last steps' outputs (and, with ``step_outputs``, the earlier ones) become the map
node's inputs. When they are all final, :func:`advance` returns the map's output texts:
the JSON array of the instances' results (their last steps' outputs), then one array per
earlier step. A failed instance fails the map (it consumes the instance's result), and so
everything downstream.

Nothing here awaits or knows the scheduler: the graph calls :func:`advance` from its settle
loop and queues the calls that come back ready.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eclectus.protocol import ErrorCode, GenSegment, MapSpec, Segment, VarSegment
from eclectus.server.config import ServerConfig
from eclectus.server.errors import GraphError

if TYPE_CHECKING:
    from eclectus.server.graph.graph import Graph, Node


@dataclass(frozen=True, slots=True)
class MapStep:
    """One call of a map's per-element pipeline, as submitted."""

    segments: tuple[Segment, ...]  # the prompt, ``element`` and earlier outputs unbound
    output: str  # its output's name, local to the map
    model: str | None
    where: str  # its place in the frame, for errors ("maps[0].call", "maps[0].then[1]")
    add_special_tokens: bool = True  # the step's CallSpec's: False for a chat prompt


@dataclass(slots=True)
class MapPlan:
    """What a map node needs to expand: the spec, its steps, and the limits."""

    spec: MapSpec
    steps: tuple[MapStep, ...]  # ``call`` first, then ``then``
    max_items: int
    max_element_bytes: int
    max_calls: int  # the session's max_calls_per_session
    max_vars: int  # the session's max_vars_per_session
    # once expanded: each element's result (its last step's output), and with
    # ``step_outputs`` each earlier step's outputs, element order (the map's other outputs)
    results: tuple[str, ...] = ()
    step_results: tuple[tuple[str, ...], ...] = ()

    @property
    def expanded(self) -> bool:
        return bool(self.results)


class MapFailed(Exception):
    """A map cannot expand; the graph fails its node with ``code``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def stage_map(
    spec: MapSpec, steps: list[tuple[Segment, ...]], where: str, config: ServerConfig
) -> Node:
    """The map node of ``spec`` (pure), ``steps`` being the segments of ``call`` and of each
    of ``then``; GraphError ``bad_request`` naming the field for a malformed map. Returns a
    ``Node`` whose inputs are ``items`` and the steps' outer inputs, and whose outputs are
    ``output`` and the ``step_outputs``."""
    from eclectus.server.graph.graph import Node

    if spec.element in (spec.items, spec.output, *spec.step_outputs):
        raise GraphError("bad_request", "a map's element must be a name of its own", field=where)
    if spec.step_outputs and len(spec.step_outputs) != len(spec.then):
        raise GraphError(
            "bad_request",
            f"step_outputs names {len(spec.step_outputs)} variables, the map has "
            f"{len(spec.then)} steps before its last",
            field=f"{where}.step_outputs",
        )
    plan_steps = _stage_steps(spec, steps, where)
    inputs = _outer_inputs(spec, plan_steps)
    plan = MapPlan(
        spec,
        plan_steps,
        config.max_map_items,
        config.max_map_element_bytes,
        config.max_calls_per_session,
        config.max_vars_per_session,
    )
    node_inputs = tuple(dict.fromkeys([spec.items, *inputs]))
    outputs = (spec.output, *spec.step_outputs)
    return Node(spec.id, node_inputs, outputs, model=spec.call.model, map=plan)


def _stage_steps(
    spec: MapSpec, steps: list[tuple[Segment, ...]], where: str
) -> tuple[MapStep, ...]:
    """Each step with its one output; GraphError naming the step whose output is missing,
    doubled or clashes with a name of the map, or that reads a later step (pure)."""
    calls = [spec.call, *spec.then]
    wheres = [f"{where}.call", *(f"{where}.then[{k}]" for k in range(len(spec.then)))]
    reserved = {spec.items, spec.element, spec.output, *spec.step_outputs}
    staged: list[MapStep] = []
    for call, segments, step_where in zip(calls, steps, wheres, strict=True):
        outputs = [s.gen for s in segments if isinstance(s, GenSegment)]
        if len(outputs) != 1:
            raise GraphError(
                "bad_request", "a map's call needs exactly one output", field=step_where
            )
        if outputs[0] in reserved:
            raise GraphError(
                "bad_request",
                f"output {outputs[0]!r} is already a name of the map or of an earlier step",
                field=step_where,
                var=outputs[0],
            )
        reserved.add(outputs[0])
        staged.append(
            MapStep(segments, outputs[0], call.model, step_where, call.add_special_tokens)
        )
    later = {step.output: k for k, step in enumerate(staged)}
    for k, step in enumerate(staged):
        for segment in step.segments:
            if isinstance(segment, VarSegment) and later.get(segment.var, -1) >= k:
                raise GraphError(
                    "bad_request",
                    f"reads {segment.var!r}, the output of a step that is not before it",
                    field=step.where,
                    var=segment.var,
                )
    return tuple(staged)


def _outer_inputs(spec: MapSpec, steps: tuple[MapStep, ...]) -> list[str]:
    """The variables of the session the steps read, in step and prompt order (pure)."""
    local = {spec.element, *(step.output for step in steps)}
    return [
        s.var
        for step in steps
        for s in step.segments
        if isinstance(s, VarSegment) and s.var not in local
    ]


def check_names_apart(plan: MapPlan, is_session_var: Callable[[str], bool]) -> None:
    """GraphError ``bad_request`` naming the first step whose output a step reads while a
    variable of the session has that name too: the read would be ambiguous (pure)."""
    reads = {s.var for step in plan.steps for s in step.segments if isinstance(s, VarSegment)}
    for step in plan.steps:
        if step.output in reads and is_session_var(step.output):
            raise GraphError(
                "bad_request",
                f"output {step.output!r} is also a variable of the session that a step "
                "reads: give the step's output a name of its own",
                field=step.where,
                var=step.output,
            )


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


def advance(graph: Graph, node: Node) -> list[Node] | tuple[str, ...]:
    """Move a map whose inputs are final on (mutates ``graph``): expand it (returns the new
    instance calls, WAITING, for the caller to settle), or, once expanded, the texts of its
    outputs (``output``, then each of ``step_outputs``). MapFailed when it cannot expand."""
    plan = node.map
    assert plan is not None
    if plan.expanded:
        arrays = (plan.results, *plan.step_results)
        return tuple(_json_array(graph, var_ids) for var_ids in arrays)
    items = parse_items(graph.vars[plan.spec.items].value or "", plan.spec.items_path)
    if not items:
        node.inputs = ()
        return ("[]",) * len(node.outputs)
    _check_limits(graph, plan, items)
    return _expand(graph, node, plan, [element_text(e) for e in items])


def instances(graph: Graph, node: Node) -> list[Node]:
    """An expanded map's instance calls still in the graph (pure): the producers of its
    inputs (its instances' results) and of theirs, back to the first step; none before it
    expands. The graph fails them with their map: nothing else can use their results."""
    plan = node.map
    assert plan is not None
    found: list[Node] = []
    stack = list(node.inputs) if plan.expanded else []
    seen: set[str] = set()
    while stack:
        producer = graph.producer(stack.pop())
        if producer is None or producer.node_id in seen or producer.parent_map != node.node_id:
            continue  # gone, seen, or an outer input: not the map's own
        seen.add(producer.node_id)
        found.append(producer)
        stack.extend(producer.inputs)
    return found


def _json_array(graph: Graph, var_ids: Sequence[str]) -> str:
    return json.dumps([graph.vars[v].value or "" for v in var_ids], ensure_ascii=False)


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
    num_steps = len(plan.steps)
    per = f" of {num_steps} steps" if num_steps > 1 else ""
    if len(graph.nodes) + num * num_steps > plan.max_calls:
        raise MapFailed(
            "limit_exceeded",
            f"{num} instances{per} would exceed max_calls_per_session={plan.max_calls}",
        )
    if len(graph.vars) + num * (1 + num_steps) > plan.max_vars:
        raise MapFailed(
            "limit_exceeded",
            f"{num} instances{per} would exceed max_vars_per_session={plan.max_vars}",
        )


def _expand(graph: Graph, node: Node, plan: MapPlan, texts: list[str]) -> list[Node]:
    from eclectus.server.graph.graph import Variable, VarState

    spec = plan.spec
    variables: list[Variable] = []
    instances: list[Node] = []
    by_step: list[list[str]] = [[] for _ in plan.steps]  # each step's outputs, element order
    for i, text in enumerate(texts):
        element_id = f"{spec.id}#{i}.element"
        if element_id in graph.vars:
            raise MapFailed("duplicate_var", f"instance id {[element_id]!r} is in use")
        # an element derives from the items: it carries their attained service (ATLAS)
        element = Variable(element_id, value=text, state=VarState.READY, released=True)
        element.service = graph.vars[spec.items].service
        variables.append(element)
        bound = {spec.element: element_id}  # local name -> this instance's variable
        for k, step in enumerate(plan.steps):
            instance = _instance(graph, node, step, f"{spec.id}#{i}" + (f".{k}" if k else ""))
            instance.segments = tuple(_bind(s, bound, instance.outputs[0]) for s in step.segments)
            previous = by_step[k - 1][i] if k else None  # runs after it, read or not
            reads = (s.var for s in instance.segments if isinstance(s, VarSegment))
            instance.inputs = tuple(dict.fromkeys([*reads, *([previous] if previous else [])]))
            instance.group = f"map/{id(graph)}/{spec.id}" + (f".{k}" if k else "")
            bound[step.output] = instance.outputs[0]
            by_step[k].append(instance.outputs[0])
            variables.append(Variable(instance.outputs[0], released=True))
            instances.append(instance)
    graph.add(variables, instances)
    plan.results = tuple(by_step[-1])
    plan.step_results = tuple(tuple(o) for o in by_step[:-1]) if spec.step_outputs else ()
    node.inputs = tuple(dict.fromkeys([*plan.results, *(v for o in plan.step_results for v in o)]))
    for var_id in node.inputs:
        graph.vars[var_id].consumers[node.node_id] = None
    return instances


def _instance(graph: Graph, node: Node, step: MapStep, node_id: str) -> Node:
    """A WAITING call of ``step`` with its output, segments and inputs still to bind (pure);
    MapFailed if an id it would take is in use."""
    from eclectus.server.graph.graph import Node, NodeState

    output_id = f"{node_id}.out"
    taken = [output_id] if output_id in graph.vars else []
    if taken or node_id in graph.nodes:
        raise MapFailed("duplicate_var", f"instance id {taken or node_id!r} is in use")
    instance = Node(
        node_id, (), (output_id,), model=step.model, add_special_tokens=step.add_special_tokens
    )
    instance.objective, instance.arrival = node.objective, node.arrival
    instance.parent_map = node.node_id
    instance.state = NodeState.WAITING
    return instance


def _bind(segment: Segment, bound: dict[str, str], output_id: str) -> Segment:
    if isinstance(segment, VarSegment) and segment.var in bound:
        return VarSegment(var=bound[segment.var])
    if isinstance(segment, GenSegment):
        return GenSegment(gen=output_id, sampling=segment.sampling)
    return segment
