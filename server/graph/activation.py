"""What a get does upstream before anything is queued: the arrival each node ranks by under
app-FIFO, and the task groups of fan-in siblings (GraphScheduler.activate calls both). Every walk
is linear in the nodes and edges it is given."""

from __future__ import annotations

from eclectus.server.graph.graph import FINAL_NODE_STATES, Graph, Node


def stamp_arrivals(graph: Graph, nodes: list[Node], now: float) -> None:
    """App-FIFO ranks by the *program's* arrival, not the session's, so a long-lived session
    that starts a new, independent program does not outrank newer applications: a node's
    arrival is its first activation (``now``: the scheduler passes the session's current
    program's arrival, policies.program_arrival), or the earliest arrival upstream of it
    (work that continues earlier work is further along). One pass in topological order
    (producers first), so the cost is linear in ``nodes`` and their edges. Mutates their
    arrival."""
    for node in nodes:
        node.arrival = now if node.arrival is None else min(node.arrival, now)
    for node in producers_first(graph, nodes):
        for var_id in node.inputs:
            producer = graph.producer(var_id)
            upstream = producer.arrival if producer is not None else None
            # set above for every node (never ``node.arrival or now``: 0.0 is falsy)
            if upstream is not None and node.arrival is not None and upstream < node.arrival:
                node.arrival = upstream


def form_groups(graph: Graph, session_id: str, var_id: str, nodes: list[Node]) -> None:
    """Fan-in siblings: the calls feeding one consumer (seen through ops) form a group.
    Consumers are taken downstream first (the get, then ``nodes`` in upstream order) and
    share one set of walked ops, so each op is walked once per get: an op region shared
    by two consumers groups its calls with the first (downstream) one."""
    consumers: list[tuple[str, tuple[str, ...]]] = [(f"get:{var_id}", (var_id,))]
    consumers += [(n.node_id, n.inputs) for n in nodes if n.is_call]
    walked: set[str] = set()
    for consumer_id, inputs in consumers:
        siblings = [n for n in feeding_calls(graph, inputs, walked) if n.group is None]
        if len(siblings) >= 2:
            for sibling in siblings:
                sibling.group = f"{session_id}/{consumer_id}"


def feeding_calls(graph: Graph, var_ids: tuple[str, ...], walked: set[str]) -> list[Node]:
    """The unfinished calls producing ``var_ids``, looking through ops not in ``walked``
    (mutates ``walked``: adds the ops walked; each op once, so a DAG of ops that reaches
    one node along many paths costs its size, not its number of paths)."""
    calls: dict[str, Node] = {}
    stack = list(var_ids)
    while stack:
        producer = graph.producer(stack.pop())
        if producer is None or producer.state in FINAL_NODE_STATES:
            continue
        if producer.is_call:
            calls[producer.node_id] = producer
        elif producer.node_id not in walked:
            walked.add(producer.node_id)
            stack.extend(producer.inputs)
    return list(calls.values())


def producers_first(graph: Graph, nodes: list[Node]) -> list[Node]:
    """``nodes`` in topological order, producers before consumers (pure; Kahn's algorithm
    over the edges inside ``nodes``, linear in their size)."""
    members = {n.node_id: n for n in nodes}
    num_waiting = dict.fromkeys(members, 0)  # producers inside ``nodes`` not yet placed
    consumers: dict[str, list[Node]] = {}
    for node in nodes:
        for var_id in node.inputs:
            producer = graph.producer(var_id)
            if producer is not None and producer.node_id in members:
                num_waiting[node.node_id] += 1
                consumers.setdefault(producer.node_id, []).append(node)
    order = [n for n in nodes if num_waiting[n.node_id] == 0]
    for node in order:  # grows while it is walked
        for consumer in consumers.get(node.node_id, ()):
            num_waiting[consumer.node_id] -= 1
            if num_waiting[consumer.node_id] == 0:
                order.append(consumer)
    assert len(order) == len(nodes), "the graph has a cycle"
    return order
