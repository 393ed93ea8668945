"""Switches: routing on the server, one branch of the graph chosen by a router's literal.

A switch node (``Node.switch``) consumes ``on``, the output of a call constrained to a
``choice`` of literals (or, with a ``path``, to a JSON Schema pinning that field to an
``enum`` of strings: eclectus/protocol/schema_enum.py), and produces one *gate* variable per
case (``{switch}#case{i}``, released at birth, so freed once its consumers are done). Every
node a case guards gets that case's gate as one more input: it cannot run before the switch
resolves, a get downstream of it activates the switch and the router (so the router inherits
the branch's objective), and cycles through a switch are refused at submit like any other.

When ``on`` is final, :func:`resolve` makes the taken case's gate READY (its nodes may run)
and fails every other gate with ``skipped``: the graph's failure propagation then skips the
nodes they guard and everything consuming those, before any of them was dispatched. A value
that is none of the cases fails every gate with ``bad_request`` naming the variable and the
value. Nothing here awaits or knows the scheduler.
"""

from __future__ import annotations

import json
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eclectus.protocol import MAX_SWITCH_DEPTH, GenSegment, StructuredOutputs, SwitchSpec
from eclectus.protocol.schema_enum import NotPinned, field_at, pinned_literals
from eclectus.server.errors import GraphError

if TYPE_CHECKING:
    from eclectus.server.graph.graph import Graph, Node, Variable


@dataclass(slots=True)
class SwitchPlan:
    """A switch's routing table: each literal's gate index, and each guarded node's."""

    spec: SwitchSpec
    gates: dict[str, str]  # literal -> gate variable id
    guarded: dict[str, str]  # guarded node id -> gate variable id


def gate_id(switch_id: str, case: int) -> str:
    return f"{switch_id}#case{case}"


def stage_switch(
    spec: SwitchSpec,
    where: str,
    graph: Graph,
    staged: Mapping[str, Node],
    guards: Mapping[str, str],
    declared: Container[str],
) -> tuple[Node, list[Variable]]:
    """Check one switch against the graph and the fragment's nodes (``staged``, by id;
    ``guards``: node id -> switch id of the fragment's switches staged so far; ``declared``:
    the fragment's variable ids) and build its
    node and gate variables (pure: nothing is added; :func:`apply_guards` wires the gates
    when the graph adds the node). GraphError naming the field when a rule fails."""
    from eclectus.server.graph.graph import Node, NodeState, Variable

    choices = _choices(spec, where, graph, staged, declared)
    unknown = [literal for literal in spec.cases if literal not in choices]
    if unknown:
        raise GraphError(
            "bad_request",
            f"case {unknown[0]!r} is not one of {spec.on!r}'s choices {list(choices)}"
            + (f" (switch {spec.id!r}, path {spec.path!r})" if spec.path else ""),
            field=f"{where}.cases",
            var=spec.on,
        )
    depth = _depth(spec.on, graph, staged, guards)
    if depth > MAX_SWITCH_DEPTH:
        raise GraphError(
            "bad_request",
            f"switches nested {depth} deep, limit MAX_SWITCH_DEPTH={MAX_SWITCH_DEPTH}",
            field=f"{where}.on",
            var=spec.on,
        )
    gates = {literal: gate_id(spec.id, i) for i, literal in enumerate(spec.cases)}
    guarded: dict[str, str] = {}
    for literal, node_ids in spec.cases.items():
        for node_id in node_ids:
            node = staged.get(node_id) or graph.nodes.get(node_id)
            field = f"{where}.cases[{literal!r}]"
            if node is None:
                raise GraphError("bad_request", f"no call, op or map {node_id!r}", field=field)
            if node.switch is not None:
                raise GraphError("bad_request", f"{node_id!r} is a switch", field=field)
            if node.guard is not None or node_id in guards:
                raise GraphError(
                    "bad_request", f"{node_id!r} is guarded by another switch", field=field
                )
            if node_id not in staged and node.state is not NodeState.IDLE:
                raise GraphError(
                    "bad_request", f"{node_id!r} is already active; guard it before", field=field
                )
            guarded[node_id] = gates[literal]
    taken = [g for g in gates.values() if g in graph.vars]
    if taken:
        raise GraphError("duplicate_var", f"gate id {taken[0]!r} is in use", field=where)
    node = Node(spec.id, (spec.on,), tuple(gates.values()))
    node.switch = SwitchPlan(spec, gates, guarded)
    return node, [Variable(g, name="gate", released=True) for g in gates.values()]


def _choices(
    spec: SwitchSpec,
    where: str,
    graph: Graph,
    staged: Mapping[str, Node],
    declared: Container[str],
) -> tuple[str, ...]:
    """The literals ``on``'s producer is constrained to (pure); GraphError when it is not
    a call's output constrained to a ``choice``."""
    variable = graph.vars.get(spec.on)
    producer_id = variable.producer if variable is not None else None
    producer = graph.nodes.get(producer_id or "")
    if producer is None:
        producer = next((n for n in staged.values() if spec.on in n.outputs), None)
    if producer is None and variable is None and spec.on not in declared:
        raise GraphError(
            "unknown_var", f"unknown variable {spec.on!r}", field=f"{where}.on", var=spec.on
        )
    for segment in producer.segments if producer is not None else ():
        if isinstance(segment, GenSegment) and segment.gen == spec.on:
            constraint = segment.sampling.structured_outputs
            if spec.path:
                return _pinned(spec, where, constraint)
            if constraint is not None and constraint.choice is not None:
                return constraint.choice
    kind = "a JSON Schema" if spec.path else "a choice of literals"
    raise GraphError(
        "bad_request",
        f"{spec.on!r} is not the output of a call constrained to {kind}",
        field=f"{where}.on",
        var=spec.on,
    )


def _pinned(spec: SwitchSpec, where: str, constraint: StructuredOutputs | None) -> tuple[str, ...]:
    """The literals ``on``'s JSON Schema pins ``spec.path`` to (pure); GraphError naming
    the switch and the path when it does not."""
    if constraint is None or constraint.json_schema is None:
        raise GraphError(
            "bad_request",
            f"switch {spec.id!r}: a path needs {spec.on!r} constrained to a JSON Schema",
            field=f"{where}.on",
            var=spec.on,
        )
    try:
        return pinned_literals(json.loads(constraint.json_schema), spec.path)
    except NotPinned as exc:
        raise GraphError(
            "bad_request",
            f"switch {spec.id!r}: path {spec.path!r} of {spec.on!r}: {exc}",
            field=f"{where}.path",
            var=spec.on,
        ) from None


def _depth(on: str, graph: Graph, staged: Mapping[str, Node], guards: Mapping[str, str]) -> int:
    """How deep a switch on ``on`` nests: 1 plus the depth of the switch guarding ``on``'s
    producer (pure; a chain of at most MAX_SWITCH_DEPTH + 1 links is walked)."""
    depth = 1
    while depth <= MAX_SWITCH_DEPTH:
        producer = next((n for n in staged.values() if on in n.outputs), None)
        if producer is None:
            producer = graph.producer(on) if on in graph.vars else None
        if producer is None:
            return depth
        guard = guards.get(producer.node_id) or producer.guard
        switch = staged.get(guard or "") or graph.nodes.get(guard or "")
        if switch is None or switch.switch is None:
            return depth
        on, depth = switch.switch.spec.on, depth + 1
    return depth


def apply_guards(graph: Graph, node: Node) -> None:
    """Wire a switch just added to ``graph``: each guarded node consumes its case's gate
    (mutates those nodes and the gates)."""
    assert node.switch is not None
    for node_id, gate in node.switch.guarded.items():
        guarded = graph.nodes[node_id]
        guarded.inputs = (*guarded.inputs, gate)
        guarded.guard = node.node_id
        graph.vars[gate].consumers[node_id] = None


def resolve(graph: Graph, node: Node) -> list[Node]:
    """``on`` is final: open the taken case's gate and skip the others (mutates). Returns
    the nodes to settle (the taken gate's consumers)."""
    plan = node.switch
    assert plan is not None
    text = graph.vars[plan.spec.on].value or ""
    # under a path, the field of the JSON reply (None: not JSON, or no such field — a
    # constraint broken, say by an engine without the budget guarantee)
    value = field_at(text, plan.spec.path) if plan.spec.path else text
    if value is None or value not in plan.gates:
        at = f" at {plan.spec.path!r}" if plan.spec.path else ""
        shown = value if value is not None else text
        message = (
            f"switch {node.node_id!r}: {plan.spec.on!r}{at} is {shown!r}, "
            f"not one of its cases {list(plan.gates)}"
        )
        graph.fail(node, "bad_request", message)
        return []
    skipped = (
        f"skipped: switch {node.node_id!r} took case {value!r} of {plan.spec.on!r}, not this branch"
    )
    for literal, gate in plan.gates.items():
        if literal != value:
            graph.fail_var(graph.vars[gate], "skipped", skipped)
    return graph.finish_output(node, plan.gates[value], "")
