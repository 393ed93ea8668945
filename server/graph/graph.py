"""One session's DAG of Semantic Variables and the calls and ops that produce them.

The graph is plain synchronous state. It knows structure and status, never asyncio or the
engine: the scheduler tells it what happened (``start``, ``complete_output``, ``fail``) and
it answers with the nodes that became ready. Ops are instant, so the graph runs them itself
as soon as they are active and their inputs are ready.

Life of a node: IDLE (declared) -> WAITING (activated by a get, inputs pending) -> QUEUED
(inputs ready, handed to the scheduler) -> RUNNING -> DONE | FAILED. Only active nodes run:
that is lazy activation.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from eclectus.protocol import ErrorCode, OpSpec, Segment, Usage
from eclectus.server.errors import GraphError
from eclectus.server.graph.map_op import MapFailed, MapPlan, advance, instances
from eclectus.server.graph.objectives import Objective
from eclectus.server.graph.policies import computed_tokens
from eclectus.server.graph.release import sweep
from eclectus.server.graph.switch_op import SwitchPlan, apply_guards, resolve
from eclectus.server.graph.text_ops import TextOpFailed, output_bound, run_text_op


class VarState(enum.Enum):
    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"


class NodeState(enum.Enum):
    IDLE = "idle"
    WAITING = "waiting"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


FINAL_NODE_STATES = (NodeState.DONE, NodeState.FAILED)


@dataclass(slots=True, eq=False)
class Variable:
    """A named piece of text: a constant, a client-set value, or a node's output."""

    var_id: str
    name: str | None = None
    value: str | None = None
    state: VarState = VarState.PENDING
    producer: str | None = None  # node id; None: a constant or set by the client
    # node ids in declaration order (a dict as an ordered set: O(1) removal on release)
    consumers: dict[str, None] = field(default_factory=dict)
    released: bool = False  # the client said it no longer needs this id (release.py)
    error_code: ErrorCode | None = None
    error_message: str | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    # called once when the variable becomes READY or FAILED; the session's gets wait here
    watchers: list[Callable[[Variable], None]] = field(default_factory=list)
    # called with each streamed piece of text while the producer generates
    streamers: list[Callable[[str], None]] = field(default_factory=list)
    # tokens the engine computed along the heaviest path of calls that produced this value
    # (policies.py, ATLAS): a call's output adds the call's own tokens to its rank's
    # service; an op's outputs take the heaviest of its inputs'; a constant is 0
    service: int = 0


@dataclass(slots=True, eq=False)
class Node:
    """A call (``segments`` with at least one GenSegment), an op (``op``), a map (``map``,
    a fan-out into calls: map_op.py) or a switch (``switch``, routing: switch_op.py)."""

    node_id: str
    inputs: tuple[str, ...]  # distinct input var ids, in prompt order
    outputs: tuple[str, ...]  # output var ids, in generation order
    segments: tuple[Segment, ...] = ()
    op: OpSpec | None = None
    map: MapPlan | None = None
    switch: SwitchPlan | None = None
    guard: str | None = None  # the switch whose case guards this node (switch_op.py)
    model: str | None = None
    add_special_tokens: bool = True  # a call's prompt: False when a chat template rendered it
    state: NodeState = NodeState.IDLE
    objective: Objective | None = None
    group: str | None = None
    # app-FIFO rank: when the work this node belongs to first arrived (its earliest
    # activation, or an upstream node's, whichever is earlier); see GraphScheduler.activate
    arrival: float | None = None
    # inputs[:num_inputs_ready] are known READY (a READY variable stays READY), so settling
    # a node with k inputs costs O(k) in all, not O(k) each time one of them resolves
    num_inputs_ready: int = 0
    cursor_inputs: tuple[str, ...] | None = None  # the inputs that cursor counts (a map
    # replaces its inputs when it expands: the cursor starts again then)
    # a call's attained service when it was queued (policies.py), and the tokens its
    # outputs computed since, so far
    service_key: int = 0
    service_tokens: int = 0
    parent_map: str | None = None  # a map instance's map node (map_op.py)

    @property
    def is_call(self) -> bool:
        return self.op is None and self.map is None and self.switch is None


def run_op(op: OpSpec, texts: list[str], max_chars: int | None = None) -> str | None:
    """The text an op produces from its inputs' texts, or None when it would be longer than
    ``max_chars`` (pure); a text op Python would not answer with a string raises
    TextOpFailed. A spread op's one input is a map's output, always a JSON array of
    strings (map_op.py). The size is known before anything is built: ops over ops double a
    text per level, so a few KB of submit could otherwise ask for terabytes."""
    if op.op not in ("join", "repr_list"):  # a text op (text_ops.py); may raise TextOpFailed
        if max_chars is not None and output_bound(op, texts) > max_chars:
            return None
        return run_text_op(op, texts)
    if op.spread:
        texts = json.loads(texts[0])
    num_chars = sum(map(len, texts))
    if op.op == "join":
        num_chars += len(op.prefix) + len(op.suffix) + len(op.sep) * max(len(texts) - 1, 0)
    if max_chars is not None and num_chars > max_chars:
        return None
    if op.op == "join":
        return op.prefix + op.sep.join(texts) + op.suffix
    text = repr(list(texts))  # repr_list: exactly Python's repr of a list of str
    return text if max_chars is None or len(text) <= max_chars else None


class Graph:
    """The variables and nodes of one session. Every method that changes state says so."""

    def __init__(
        self, on_op_run: Callable[[], None] | None = None, max_op_chars: int | None = None
    ) -> None:
        self.vars: dict[str, Variable] = {}
        self.on_op_run = on_op_run  # counts server-side ops for /metrics
        self.max_op_chars = max_op_chars  # an op's output is at most this long (None: any)
        self.nodes: dict[str, Node] = {}
        # nodes added since the pin table last indexed them (it drains this list)
        self.unindexed: list[Node] = []

    # -- lookups (pure) -------------------------------------------------------------------

    def var(self, var_id: str, *, field: str = "var") -> Variable:
        """The variable ``var_id``; GraphError unknown_var if this session has none."""
        variable = self.vars.get(var_id)
        if variable is None:
            raise GraphError("unknown_var", f"unknown variable {var_id!r}", field=field, var=var_id)
        return variable

    def producer(self, var_id: str) -> Node | None:
        """The node producing ``var_id``; None for a constant, a client-set variable, or a
        finished producer already freed by a release (pure)."""
        producer = self.vars[var_id].producer
        return self.nodes.get(producer) if producer is not None else None

    def upstream(self, var_id: str) -> list[Node]:
        """Unfinished nodes that ``var_id`` depends on, consumers before producers (pure)."""
        order: list[Node] = []
        seen: set[str] = set()
        stack = [var_id]
        while stack:
            node = self.producer(stack.pop())
            if node is None or node.node_id in seen or node.state in FINAL_NODE_STATES:
                continue
            seen.add(node.node_id)
            order.append(node)
            stack.extend(node.inputs)
        return order

    def inputs_ready(self, node: Node) -> bool:
        """Whether every input is READY (mutates only ``node.num_inputs_ready``, a cursor)."""
        inputs = node.inputs
        if node.cursor_inputs is not inputs:
            node.cursor_inputs, node.num_inputs_ready = inputs, 0
        while node.num_inputs_ready < len(inputs):
            if self.vars[inputs[node.num_inputs_ready]].state is not VarState.READY:
                return False
            node.num_inputs_ready += 1
        return True

    def input_service(self, node: Node) -> int:
        """The heaviest attained service among ``node``'s inputs (pure; policies.py)."""
        return max((self.vars[v].service for v in node.inputs), default=0)

    def failed_input(self, node: Node) -> Variable | None:
        failed = (self.vars[v] for v in node.inputs if self.vars[v].state is VarState.FAILED)
        return next(failed, None)

    def depth(self) -> int:
        """The longest chain of dependent calls (ops add no depth) (pure). Iterative, each
        node once: a chain thousands deep costs its length, never the recursion limit."""
        memo: dict[str, int] = {}
        for root in self.nodes.values():
            stack = [root]
            while stack:
                node = stack[-1]
                if node.node_id in memo:
                    stack.pop()
                    continue
                above = [p for p in self._producers(node) if p.node_id not in memo]
                if above:
                    stack.extend(above)
                    continue
                stack.pop()
                deepest = max((memo[p.node_id] for p in self._producers(node)), default=0)
                memo[node.node_id] = deepest + (1 if node.is_call else 0)
        return max(memo.values(), default=0)

    def _producers(self, node: Node) -> list[Node]:
        """The nodes producing ``node``'s inputs that are still in the graph (pure)."""
        producers = []
        for var_id in node.inputs:
            variable = self.vars.get(var_id)
            producer = self.nodes.get(variable.producer or "") if variable else None
            if producer is not None:
                producers.append(producer)
        return producers

    # -- transitions (mutate) -------------------------------------------------------------

    def add(self, variables: Iterable[Variable], nodes: Iterable[Node]) -> None:
        """Insert an already validated fragment (mutates); see fragment.py for validation."""
        nodes = list(nodes)
        switches = [n for n in nodes if n.switch is not None]
        for variable in variables:
            self.vars[variable.var_id] = variable
        for node in nodes:
            self.nodes[node.node_id] = node
            self.unindexed.append(node)
            for var_id in node.outputs:
                self.vars[var_id].producer = node.node_id
            for var_id in node.inputs:
                self.vars[var_id].consumers[node.node_id] = None
        for node in switches:  # after all nodes: a switch may guard a node added after it
            apply_guards(self, node)

    def activate(self, nodes: Iterable[Node]) -> list[Node]:
        """Mark IDLE ``nodes`` active (mutates) and settle; returns calls now ready to queue."""
        woken = []
        for node in nodes:
            if node.state is NodeState.IDLE:
                node.state = NodeState.WAITING
                woken.append(node)
        for node in woken:  # an input that failed before activation fails it now
            bad = self.failed_input(node) if node.state is NodeState.WAITING else None
            if bad is not None:
                code = bad.error_code or "engine_error"
                self.fail(node, code, f"input {bad.var_id!r} failed: {bad.error_message}")
        return self._settle(woken)

    def set_value(self, var_id: str, text: str) -> list[Node]:
        """The client supplies a value (mutates); returns calls now ready to queue."""
        variable = self.var(var_id)
        if variable.producer is not None or variable.state is not VarState.PENDING:
            raise GraphError(
                "duplicate_producer",
                f"variable {var_id!r} already has a producer or a value",
                field="var",
                var=var_id,
            )
        return self._resolve(variable, text, None, None)

    def start(self, node: Node) -> None:
        """QUEUED -> RUNNING when the scheduler dispatches ``node`` (mutates)."""
        assert node.state is NodeState.QUEUED, node.state
        node.state = NodeState.RUNNING

    def stream(self, var_id: str, text: str) -> None:
        """Pass a piece of generated text to the variable's streamers (no state change)."""
        for streamer in list(self.vars[var_id].streamers):
            streamer(text)

    def complete_output(
        self, node: Node, var_id: str, text: str, usage: Usage | None, finish_reason: str | None
    ) -> list[Node]:
        """One output of a running call is final (mutates); the call is DONE after its last
        output. Returns calls now ready to queue."""
        assert node.state is NodeState.RUNNING and var_id in node.outputs, (node.state, var_id)
        if var_id == node.outputs[-1]:
            node.state = NodeState.DONE
        node.service_tokens += computed_tokens(usage)
        self.vars[var_id].service = node.service_key + node.service_tokens
        ready = self._resolve(self.vars[var_id], text, usage, finish_reason)
        sweep(self, [node.node_id], [var_id])
        return ready

    def fail(self, node: Node, code: ErrorCode, message: str) -> list[Node]:
        """Fail ``node``, its unfinished outputs and everything downstream (mutates).
        Returns the failed nodes that were QUEUED or RUNNING, for the scheduler to drop."""
        dropped: list[Node] = []
        failed: list[str] = []
        stack = [node]
        while stack:
            current = stack.pop()
            if current.state in FINAL_NODE_STATES:
                continue
            if current.state in (NodeState.QUEUED, NodeState.RUNNING):
                dropped.append(current)
            current.state = NodeState.FAILED
            failed.append(current.node_id)
            if current.map is not None:  # its instances exist only for it: stop them too
                stack.extend(instances(self, current))
            for var_id in current.outputs:
                variable = self.vars.get(var_id)  # None: released and deleted already
                if variable is not None and variable.state is VarState.PENDING:
                    self._finish_var(variable, VarState.FAILED, code, message)
                    stack.extend(self.nodes[c] for c in variable.consumers)
        sweep(self, failed, [])
        return dropped

    def fail_var(self, variable: Variable, code: ErrorCode, message: str) -> None:
        """Fail a pending variable of a node that goes on (a switch's gate) and everything
        downstream of it (mutates). Its consumers are never QUEUED or RUNNING: a gate is an
        input of each, still pending."""
        self._finish_var(variable, VarState.FAILED, code, message)
        for consumer in [self.nodes[c] for c in variable.consumers]:
            dropped = self.fail(consumer, code, message)
            assert not dropped, [n.node_id for n in dropped]
        sweep(self, [], [variable.var_id])

    def finish_output(self, node: Node, var_id: str, text: str) -> list[Node]:
        """An instant node's (a switch's) last pending output is ``text``: the node is DONE
        (mutates); returns the output's consumers, to settle."""
        node.state = NodeState.DONE
        output = self.vars[var_id]
        output.value = text
        output.service = self.input_service(node)
        self._finish_var(output, VarState.READY, None, None)
        consumers = [self.nodes[c] for c in output.consumers]
        sweep(self, [node.node_id], [])
        return consumers

    def close(self, message: str) -> None:
        """Fail every pending variable with 'cancelled' so no watcher waits forever (mutates)."""
        for node in self.nodes.values():
            if node.state not in FINAL_NODE_STATES:
                node.state = NodeState.FAILED
        for variable in self.vars.values():
            if variable.state is VarState.PENDING:
                self._finish_var(variable, VarState.FAILED, "cancelled", message)

    # -- internals ------------------------------------------------------------------------

    def _resolve(
        self, variable: Variable, text: str, usage: Usage | None, finish_reason: str | None
    ) -> list[Node]:
        variable.value = text
        variable.usage = usage
        variable.finish_reason = finish_reason
        self._finish_var(variable, VarState.READY, None, None)
        return self._settle(self.nodes[c] for c in variable.consumers)

    def _finish_var(
        self, variable: Variable, state: VarState, code: ErrorCode | None, message: str | None
    ) -> None:
        variable.state = state
        variable.error_code = code
        variable.error_message = message
        watchers, variable.watchers, variable.streamers = variable.watchers, [], []
        for watcher in watchers:
            watcher(variable)

    def _finish_instant(self, node: Node, texts: Sequence[str]) -> list[Node]:
        """An op or map is DONE with its outputs' ``texts`` (mutates); returns their
        consumers."""
        node.state = NodeState.DONE
        consumers: dict[str, None] = {}
        service = self.input_service(node)
        for var_id, text in zip(node.outputs, texts, strict=True):
            output = self.vars[var_id]
            output.value = text
            output.service = service
            self._finish_var(output, VarState.READY, None, None)
            consumers.update(output.consumers)
        woken = [self.nodes[c] for c in consumers]
        sweep(self, [node.node_id], [])
        return woken

    def _settle(self, candidates: Iterable[Node]) -> list[Node]:
        """Move WAITING nodes whose inputs are all READY on: ops run at once (and may wake
        more nodes), ready calls are QUEUED and returned. (A failing input fails its
        consumers itself, see :meth:`fail`; :meth:`activate` checks inputs failed before.)"""
        ready: list[Node] = []
        stack = list(candidates)
        while stack:
            node = stack.pop()
            if node.state is not NodeState.WAITING:
                continue
            if not self.inputs_ready(node):
                continue
            elif node.op is not None:
                texts = [self.vars[v].value or "" for v in node.op.inputs]
                try:
                    text = run_op(node.op, texts, self.max_op_chars)
                except TextOpFailed as exc:
                    self.fail(node, "bad_request", f"op {node.node_id!r} ({node.op.op}): {exc}")
                    continue
                if text is None:
                    message = f"op {node.node_id!r} output over {self.max_op_chars} characters"
                    self.fail(node, "limit_exceeded", message)
                    continue
                if self.on_op_run is not None:
                    self.on_op_run()
                stack.extend(self._finish_instant(node, (text,)))
            elif node.map is not None:
                try:
                    step = advance(self, node)  # expands the map, or its final texts
                except MapFailed as exc:
                    self.fail(node, exc.code, f"map {node.node_id!r}: {exc.message}")
                    continue
                stack.extend(step if isinstance(step, list) else self._finish_instant(node, step))
            elif node.switch is not None:
                stack.extend(resolve(self, node))
            else:
                node.state = NodeState.QUEUED
                ready.append(node)
        return ready
