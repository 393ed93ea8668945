"""Releasing variables a client no longer needs, so a long-lived session stays bounded.

The client may ``release`` variable ids it will not mention again (the SDK can do so when a
SemanticVariable is garbage-collected). Nothing is deleted while it can still matter:

- a released variable is deleted once it is final (READY or FAILED) and every node that
  consumes it is final (a finished node never reads its inputs again);
- a node is deleted once it is final (DONE or FAILED) and all its outputs are released.

A node finishing or being deleted may make its inputs deletable, a variable being deleted
its producer, and so on: :func:`sweep` follows that as a worklist. Nodes that were never
activated stay until the session ends (their outputs could still be asked for).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eclectus.server.graph.graph import Graph, Variable


def release(graph: Graph, var_ids: Iterable[str]) -> int:
    """Mark ``var_ids`` released and delete what nothing needs any more (mutates). Unknown
    ids are ignored, so a release is idempotent. Returns how many variables were deleted."""
    marked: list[str] = []
    producers: list[str] = []
    for var_id in var_ids:
        variable = graph.vars.get(var_id)
        if variable is not None:
            variable.released = True
            marked.append(var_id)
            if variable.producer is not None:
                producers.append(variable.producer)
    before = len(graph.vars)
    sweep(graph, producers, marked)
    return before - len(graph.vars)


def sweep(graph: Graph, node_ids: list[str], var_ids: list[str]) -> None:
    """Delete the given nodes and variables if nothing needs them, and whatever that frees
    in turn (mutates ``graph`` and the two lists)."""
    from eclectus.server.graph.graph import FINAL_NODE_STATES, VarState

    while node_ids or var_ids:
        while node_ids:
            node = graph.nodes.get(node_ids.pop())
            if node is None or node.state not in FINAL_NODE_STATES:
                continue
            var_ids.extend(node.inputs)  # a finished node needs its inputs no more
            outputs = [graph.vars.get(v) for v in node.outputs]
            if all(v is None or v.released for v in outputs):
                del graph.nodes[node.node_id]
                for var_id in node.inputs:
                    variable = graph.vars.get(var_id)
                    if variable is not None:
                        variable.consumers.pop(node.node_id, None)
                var_ids.extend(node.outputs)
        while var_ids:
            variable = graph.vars.get(var_ids.pop())
            if variable is None or not variable.released or variable.state is VarState.PENDING:
                continue
            if _has_unfinished_consumer(graph, variable):
                continue
            del graph.vars[variable.var_id]
            if variable.producer is not None:
                node_ids.append(variable.producer)


def _has_unfinished_consumer(graph: Graph, variable: Variable) -> bool:
    """Whether a node still to run reads ``variable`` (mutates: drops the finished consumers
    it passes from ``variable.consumers``, which nothing reads again, so checking a released
    variable after each of its k consumers finishes costs O(k) in all, not O(k) each)."""
    from eclectus.server.graph.graph import FINAL_NODE_STATES

    finished: list[str] = []
    found = False
    for node_id in variable.consumers:  # declaration order; stops at the first unfinished
        node = graph.nodes.get(node_id)
        if node is not None and node.state not in FINAL_NODE_STATES:
            found = True
            break
        finished.append(node_id)
    for node_id in finished:
        del variable.consumers[node_id]
    return found
