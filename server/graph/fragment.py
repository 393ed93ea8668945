"""Validate a ``submit`` frame against a session's graph before anything of it is added.

A fragment is atomic: :func:`stage` checks every rule on the fragment together with the
existing graph and returns new Variables and Nodes only when all pass; otherwise it raises a
GraphError/LimitError naming the offending field and variable, and the graph is untouched.

Everything here is linear in the fragment and the part of the graph it touches, except token
counting, which a big fragment makes slow: the session therefore runs :func:`build` on the
event loop, counts the distinct prompt texts of :func:`known_prompts` on a worker thread, checks
them with :func:`check_prompt_sizes`, and re-checks with :func:`check_still_applies` that the
graph did not lose a variable the fragment names meanwhile. :func:`stage` does it all at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
from eclectus.server.graph.graph import Graph, Node, Variable, VarState
from eclectus.server.graph.map_op import check_names_apart, stage_map
from eclectus.server.graph.switch_op import stage_switch


@dataclass(slots=True)
class Staged:
    """A validated fragment, ready for Graph.add."""

    variables: list[Variable]
    nodes: list[Node]
    wheres: list[str]  # each node's place in the frame ("calls[3]", "ops[0]"), for errors


@dataclass(frozen=True, slots=True)
class KnownPrompt:
    """The text of a call's prompt known at submit: its constant segments and the current
    values of its inputs (empty while pending), each segment on its own, and whether the
    prompt takes special tokens (CallSpec.add_special_tokens)."""

    where: str
    node_id: str
    texts: tuple[str, ...]
    add_special_tokens: bool = True

    @property
    def key(self) -> tuple[str, bool]:
        """What its token count depends on: the flat text, and the special tokens (pure)."""
        return "".join(self.texts), self.add_special_tokens


# (a prompt's flat text, add_special_tokens) -> its tokens, as the front tokenizes it
TokenCounter = Callable[[str, bool], int]


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
    return Node(
        call.id,
        tuple(inputs),
        tuple(outputs),
        segments=segments,
        model=call.model,
        add_special_tokens=call.add_special_tokens,
    )


def stage(
    graph: Graph, frame: Submit, config: ServerConfig, count_tokens: Callable[[str], int]
) -> Staged:
    """Check ``frame`` against ``graph`` and build what it adds (pure: graph untouched),
    counting each known prompt's tokens here with ``count_tokens`` (the session counts them
    off the event loop instead)."""
    staged = build(graph, frame, config)
    counter: TokenCounter = lambda text, _special: count_tokens(text)  # noqa: E731
    check_prompt_sizes(known_prompts(staged, graph), counter, config.max_prompt_tokens)
    return staged


def build(graph: Graph, frame: Submit, config: ServerConfig) -> Staged:
    """Check every rule but prompt sizes and build what ``frame`` adds (pure)."""
    num_nodes = len(frame.calls) + len(frame.ops) + len(frame.maps) + len(frame.switches)
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
        steps = [(spec.call, f"maps[{i}].call")]
        steps += [(call, f"maps[{i}].then[{k}]") for k, call in enumerate(spec.then)]
        for call, where in steps:
            config.check_model(call.model, f"{where}.model")
        segments = [call_segments(call, where) for call, where in steps]
        nodes.append((f"maps[{i}]", stage_map(spec, segments, f"maps[{i}]", config)))
    _check_node_ids(graph, nodes)
    nodes += _stage_switches(graph, frame, nodes, new_vars)
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
        if node.map is not None:
            check_names_apart(node.map, known)
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
    return Staged(list(new_vars.values()), [n for _, n in nodes], [w for w, _ in nodes])


def _stage_switches(
    graph: Graph, frame: Submit, nodes: list[tuple[str, Node]], new_vars: dict[str, Variable]
) -> list[tuple[str, Node]]:
    """The fragment's switch nodes, checked (switch_op.py); adds their gate variables to
    ``new_vars`` (mutates only ``new_vars``: the gates are wired into the guarded nodes
    when the graph adds the fragment, and :func:`_check_acyclic` follows them before)."""
    staged = {n.node_id: n for _, n in nodes}
    guards: dict[str, str] = {}
    switches: list[tuple[str, Node]] = []
    for i, spec in enumerate(frame.switches):
        where = f"switches[{i}]"
        node, gates = stage_switch(spec, where, graph, staged, guards, new_vars)
        for gate in gates:
            if gate.var_id in new_vars:
                raise GraphError("duplicate_var", f"gate id {gate.var_id!r} is in use", field=where)
            new_vars[gate.var_id] = gate
        staged[node.node_id] = node
        guards.update(dict.fromkeys(node.switch.guarded if node.switch else (), spec.id))
        switches.append((where, node))
    return switches


def check_still_applies(graph: Graph, staged: Staged, frame: Submit) -> None:
    """After an await: every variable the fragment names but does not declare is still in
    ``graph`` (a release may have deleted one meanwhile; nothing else can change what
    :func:`build` checked, as only this session's own frames add to its graph). Pure."""
    declared = {v.var_id for v in staged.variables}
    for where, node in zip(staged.wheres, staged.nodes, strict=True):
        for var_id in node.inputs + node.outputs:
            if var_id not in declared and var_id not in graph.vars:
                raise GraphError(
                    "unknown_var", f"variable {var_id!r} was released", field=where, var=var_id
                )
    for i, get in enumerate(frame.gets):
        if get.var not in declared and get.var not in graph.vars:
            raise GraphError(
                "unknown_var", f"variable {get.var!r} was released", field=f"gets[{i}].var"
            )


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
        for node_id, gate in node.switch.guarded.items() if node.switch else ():
            consumers.setdefault(gate, []).append(node_id)  # wired when the graph adds it

    def downstream(node_id: str) -> list[str]:
        node = by_id.get(node_id) or graph.nodes.get(node_id)
        out: list[str] = []
        for var_id in node.outputs if node is not None else ():  # None: swept meanwhile
            old = graph.vars.get(var_id)
            out.extend(list(old.consumers) if old is not None else [])  # one atomic copy
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
                looped = by_id.get(child) or graph.nodes[child]  # on the stack: not swept
                raise GraphError(
                    "cycle",
                    f"call {child!r} depends on its own output",
                    field="calls",
                    var=looped.outputs[0],
                )
            if child not in colour:
                colour[child] = 1
                stack.append((child, downstream(child)))


def known_prompts(staged: Staged, graph: Graph) -> list[KnownPrompt]:
    """Each new call's known prompt text, segment by segment (pure)."""
    new_vars = {v.var_id: v for v in staged.variables}
    prompts = []
    for where, node in zip(staged.wheres, staged.nodes, strict=True):
        if not node.is_call:
            continue
        texts = []
        for segment in node.segments:
            if isinstance(segment, TextSegment):
                texts.append(segment.text)
            elif isinstance(segment, VarSegment):
                var = new_vars.get(segment.var) or graph.vars.get(segment.var)
                texts.append(var.value or "" if var is not None else "")
        prompts.append(KnownPrompt(where, node.node_id, tuple(texts), node.add_special_tokens))
    return prompts


def staged_prompts(staged: Staged) -> Iterator[tuple[tuple[Segment, ...], str]]:
    """Each new call's segments and its place in the frame, a map's steps included (pure).
    A map's first step is named as the map itself (``maps[0]``, as before steps existed),
    a later one by its place in ``then`` (``maps[0].then[1]``)."""
    for node, where in zip(staged.nodes, staged.wheres, strict=True):
        if node.map is not None:
            first, *later = node.map.steps
            yield first.segments, where
            yield from ((step.segments, step.where) for step in later)
        else:
            yield node.segments, where


def upper_bound_tokens(prompt: KnownPrompt) -> int:
    """More tokens than the front can make of ``prompt`` (pure): a token covers at least
    one UTF-8 byte, plus (generously) one per segment for a tokenizer's added prefix, plus
    BOS."""
    return sum(len(text.encode("utf-8", "surrogatepass")) + 1 for text in prompt.texts) + 1


def check_prompt_sizes(prompts: list[KnownPrompt], count_tokens: TokenCounter, limit: int) -> None:
    """Reject the first call whose known text is already over ``limit`` tokens (pure but
    for the counter): its flat text, pending inputs empty, as the front tokenizes it. The
    full prompt is checked again at dispatch, once generated inputs are known. Prompts whose
    byte size bounds them under the limit are not tokenized."""
    for prompt in prompts:
        if upper_bound_tokens(prompt) <= limit:
            continue
        num_tokens = count_tokens(*prompt.key)
        if num_tokens > limit:
            raise LimitError(
                f"prompt of {prompt.node_id!r} has {num_tokens} tokens, limit {limit}",
                field=prompt.where,
            )


def texts_to_count(prompts: list[KnownPrompt], limit: int) -> set[tuple[str, bool]]:
    """The distinct (flat text, add_special_tokens) pairs :func:`check_prompt_sizes` will
    tokenize (pure)."""
    return {prompt.key for prompt in prompts if upper_bound_tokens(prompt) > limit}
