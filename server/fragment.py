"""Validate a ``submit`` frame against a session's graph before anything of it is added.

A fragment is atomic: :func:`stage` checks every rule on the fragment together with the
existing graph and returns new Variables and Nodes only when all pass; otherwise it raises a
GraphError/LimitError naming the offending field and variable, and the graph is untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from eclectus.protocol import (
    CallSpec,
    GenSegment,
    Segment,
    Submit,
    TemplateError,
    TextSegment,
    VarSegment,
    parse_template,
)
from eclectus.server.config import ServerConfig
from eclectus.server.errors import GraphError, LimitError
from eclectus.server.graph import Graph, Node, Variable, VarState
from eclectus.server.map_op import stage_map


@dataclass(slots=True)
class Staged:
    """A validated fragment, ready for Graph.add."""

    variables: list[Variable]
    nodes: list[Node]


def call_segments(call: CallSpec, where: str) -> tuple[Segment, ...]:
    """The call's prompt as segments, from either form; GraphError on a bad template (pure)."""
    if call.segments is not None:
        return tuple(call.segments)
    assert call.template is not None
    try:
        return tuple(parse_template(call.template, dict(call.bind), dict(call.sampling)))
    except TemplateError as exc:
        raise GraphError("bad_template", str(exc), field=f"{where}.template") from exc


def _call_node(call: CallSpec, where: str) -> Node:
    segments = call_segments(call, where)
    outputs = [s.gen for s in segments if isinstance(s, GenSegment)]
    if not outputs:
        raise GraphError("bad_request", "a call needs at least one output", field=where)
    if len(set(outputs)) != len(outputs):
        raise GraphError("duplicate_producer", "an output appears twice", field=where)
    inputs = dict.fromkeys(s.var for s in segments if isinstance(s, VarSegment))
    return Node(call.id, tuple(inputs), tuple(outputs), segments=segments, model=call.model)


def stage(
    graph: Graph, frame: Submit, config: ServerConfig, count_tokens: Callable[[str], int]
) -> Staged:
    """Check ``frame`` against ``graph`` and build what it adds (pure: graph untouched)."""
    num_nodes = len(frame.calls) + len(frame.ops) + len(frame.maps)
    if len(graph.nodes) + num_nodes > config.max_calls_per_session:
        raise LimitError(
            f"session would hold {len(graph.nodes) + num_nodes} calls and ops, "
            f"limit {config.max_calls_per_session}",
            field="calls",
        )
    new_vars: dict[str, Variable] = {}
    for i, spec in enumerate(frame.vars):
        if spec.id in graph.vars or spec.id in new_vars:
            raise GraphError(
                "duplicate_var",
                f"variable {spec.id!r} is already declared",
                field=f"vars[{i}].id",
                var=spec.id,
            )
        state = VarState.READY if spec.value is not None else VarState.PENDING
        new_vars[spec.id] = Variable(spec.id, spec.name, spec.value, state)
    nodes: list[tuple[str, Node]] = []
    for i, call in enumerate(frame.calls):
        config.check_model(call.model, f"calls[{i}].model")
        nodes.append((f"calls[{i}]", _call_node(call, f"calls[{i}]")))
    for i, op in enumerate(frame.ops):
        nodes.append(
            (f"ops[{i}]", Node(op.id, tuple(dict.fromkeys(op.inputs)), (op.output,), op=op))
        )
    for i, spec in enumerate(frame.maps):
        config.check_model(spec.call.model, f"maps[{i}].call.model")
        segments = call_segments(spec.call, f"maps[{i}].call")
        nodes.append((f"maps[{i}]", stage_map(spec, segments, f"maps[{i}]", config)))
    _check_node_ids(graph, nodes)
    produced = _claim_outputs(graph, new_vars, nodes)
    if len(graph.vars) + len(new_vars) > config.max_vars_per_session:
        raise LimitError(
            f"session would hold {len(graph.vars) + len(new_vars)} variables, "
            f"limit {config.max_vars_per_session}",
            field="vars",
        )
    known = lambda v: v in graph.vars or v in new_vars  # noqa: E731
    for where, node in nodes:
        for var_id in node.inputs:
            if not known(var_id):
                raise GraphError(
                    "unknown_var",
                    f"input {var_id!r} is not a variable of this session",
                    field=where,
                    var=var_id,
                )
    _check_spreads(graph, frame, nodes)
    for i, get in enumerate(frame.gets):
        if not known(get.var):
            raise GraphError(
                "unknown_var", f"unknown variable {get.var!r}", field=f"gets[{i}].var", var=get.var
            )
    _check_acyclic(graph, new_vars, produced, [n for _, n in nodes])
    _check_prompt_sizes(nodes, new_vars, graph, config, count_tokens)
    return Staged(list(new_vars.values()), [n for _, n in nodes])


def _check_spreads(graph: Graph, frame: Submit, nodes: list[tuple[str, Node]]) -> None:
    """A spread op's input must be a map's output (always a JSON array of strings)."""
    maps = {n.outputs[0] for _, n in nodes if n.map is not None}
    for i, op in enumerate(frame.ops):
        if not op.spread:
            continue
        producer = graph.producer(op.inputs[0]) if op.inputs[0] in graph.vars else None
        if op.inputs[0] not in maps and (producer is None or producer.map is None):
            raise GraphError(
                "bad_request",
                f"a spread op's input must be a map's output, {op.inputs[0]!r} is not",
                field=f"ops[{i}].inputs",
                var=op.inputs[0],
            )


def _check_node_ids(graph: Graph, nodes: list[tuple[str, Node]]) -> None:
    seen: set[str] = set()
    for where, node in nodes:
        if node.node_id in graph.nodes or node.node_id in seen:
            raise GraphError(
                "bad_request",
                f"call or op id {node.node_id!r} is already used",
                field=f"{where}.id",
            )
        seen.add(node.node_id)


def _claim_outputs(
    graph: Graph, new_vars: dict[str, Variable], nodes: list[tuple[str, Node]]
) -> dict[str, str]:
    """Each output gets exactly one producer; undeclared outputs are declared here
    (mutates only ``new_vars``). Returns output var id -> producing node id."""
    produced: dict[str, str] = {}
    for where, node in nodes:
        for var_id in node.outputs:
            old = graph.vars.get(var_id)
            new = new_vars.get(var_id)
            taken = (
                var_id in produced
                or (old is not None and (old.producer is not None or old.state != VarState.PENDING))
                or (new is not None and new.value is not None)
            )
            if taken:
                raise GraphError(
                    "duplicate_producer",
                    f"variable {var_id!r} already has a producer or a value",
                    field=where,
                    var=var_id,
                )
            produced[var_id] = node.node_id
            if old is None and new is None:
                new_vars[var_id] = Variable(var_id)
    return produced


def _check_acyclic(
    graph: Graph, new_vars: dict[str, Variable], produced: dict[str, str], new_nodes: list[Node]
) -> None:
    """Any new cycle passes through a new node (the old graph is acyclic and gains edges only
    at new nodes), so a colouring DFS downstream of the new nodes finds it."""
    by_id = {n.node_id: n for n in new_nodes}
    consumers: dict[str, list[str]] = {}
    for node in new_nodes:
        for var_id in node.inputs:
            consumers.setdefault(var_id, []).append(node.node_id)

    def downstream(node_id: str) -> list[str]:
        node = by_id.get(node_id) or graph.nodes[node_id]
        out: list[str] = []
        for var_id in node.outputs:
            old = graph.vars.get(var_id)
            out.extend(old.consumers if old is not None else [])
            out.extend(consumers.get(var_id, []))
        return out

    colour: dict[str, int] = {}  # 1: on the DFS stack, 2: finished
    for root in by_id:
        if root in colour:
            continue
        colour[root] = 1
        stack: list[tuple[str, list[str]]] = [(root, downstream(root))]
        while stack:
            node_id, todo = stack[-1]
            if not todo:
                colour[node_id] = 2
                stack.pop()
                continue
            child = todo.pop()
            if colour.get(child) == 1:
                looped = by_id.get(child) or graph.nodes[child]
                raise GraphError(
                    "cycle",
                    f"call {child!r} depends on its own output",
                    field="calls",
                    var=looped.outputs[0],
                )
            if child not in colour:
                colour[child] = 1
                stack.append((child, downstream(child)))


def _check_prompt_sizes(
    nodes: list[tuple[str, Node]],
    new_vars: dict[str, Variable],
    graph: Graph,
    config: ServerConfig,
    count_tokens: Callable[[str], int],
) -> None:
    """Reject a call whose known text (constants and constant inputs) is already too long;
    the full prompt is checked again at dispatch, once generated inputs are known."""
    for where, node in nodes:
        if not node.is_call:
            continue
        text = []
        for segment in node.segments:
            if isinstance(segment, TextSegment):
                text.append(segment.text)
            elif isinstance(segment, VarSegment):
                var = new_vars.get(segment.var) or graph.vars.get(segment.var)
                text.append(var.value or "" if var is not None else "")
        num_tokens = count_tokens("".join(text))
        if num_tokens > config.max_prompt_tokens:
            raise LimitError(
                f"prompt of {node.node_id!r} has {num_tokens} tokens, limit "
                f"{config.max_prompt_tokens}",
                field=where,
            )
