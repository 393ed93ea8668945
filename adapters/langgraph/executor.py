"""One compiled run of a StateGraph: LangGraph's supersteps over *symbolic* state.

The algorithm is Pregel's, as LangGraph runs a StateGraph: the input is written to the state
channels (with their reducers), then each superstep runs the triggered tasks on the state as
it was at the step's start, applies all their writes at once, and triggers the next tasks:
plain edges from every node that ran, and conditional edges (routers, ``Send`` fan-outs)
evaluated on the pre-step state plus that task's own writes, as LangGraph's fresh read does.

What differs is what a value is. A node that is an LCEL runnable over an Eclectus model is
*lowered* by the chain compiler: it declares calls and returns refs (text the server will
hold), so the state holds refs and nothing is sent. A Python function node, and every
router, is a *client cut*: the refs it can see are fetched in one frame (which ships all the
calls declared so far), the function runs here, and its concrete result joins the state.
So a run costs one round trip per cut plus one for the final state, whatever the fan-out:
``Send`` tasks to an LCEL node are all declared into the same frame.

Reducers: ``operator.add`` over lists concatenates symbolic lists as they are (the order is
known); any other reducer sees concrete values (its inputs are resolved first).
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.runnables import Runnable
from langgraph._internal._constants import CONFIG_KEY_RUNTIME
from langgraph._internal._fields import get_cached_annotated_keys, get_update_as_tuples
from langgraph._internal._typing import MISSING
from langgraph.channels.base import BaseChannel
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.constants import END, START
from langgraph.errors import GraphRecursionError, InvalidUpdateError
from langgraph.runtime import Runtime
from langgraph.types import Command, Send

from eclectus.adapters.client.variables import VarState
from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.compiler.registry import lower
from eclectus.adapters.langchain.compiler.symbols import SymParsed, collect_refs
from eclectus.adapters.langgraph import function_nodes  # noqa: F401 (registers the lowering)
from eclectus.adapters.langgraph.fanout import MapRecord, MapTask, SendEach, lower_send_each
from eclectus.adapters.langgraph.routing import (
    Fork,
    ForkBudget,
    NotSwitchable,
    RouteKey,
    SwitchPoint,
    fork,
    give_up,
    split_fields,
    switch_point,
)
from eclectus.adapters.langgraph.support import is_python_node

Channels = dict[str, BaseChannel]


@dataclass(slots=True)
class Task:
    """One node run of a superstep: on the state, or on a ``Send``'s argument."""

    node: str
    arg: Any = None
    sent: bool = False


@dataclass(slots=True)
class StepRecord:
    """What a superstep produced, symbolic, for stream modes ``values`` and ``updates``."""

    values: Any  # the stream channels' values after the step; None: no chunk
    updates: list[tuple[str, Any]] = field(default_factory=list)  # (node, its update)
    # indices of ``updates`` that stand for a server map's tasks (one chunk per item)
    mapped: list[int] = field(default_factory=list)


class GraphRun:
    """The state of one run. Mutated by :meth:`run` only; ``steps`` is the record."""

    def __init__(
        self,
        app: Any,
        ctx: Lowering,
        recursion_limit: int,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> None:
        self.app = app
        self.builder = app.builder
        self.ctx = ctx
        self.recursion_limit = recursion_limit
        self.channels: Channels = {
            k: c.from_checkpoint(MISSING) for k, c in self.builder.channels.items()
        }
        self.steps: list[StepRecord] = []
        self.on_step = on_step  # told of each step as it is recorded (stream's step by step)
        self.maps: list[MapRecord] = []  # the server maps declared, for their callbacks
        # routers over a constrained choice fork into a server switch (routing.py); not
        # while streaming, whose steps are fetched one by one as they are declared
        self.switching = on_step is None
        self.depth = 0  # forks this run is a branch of
        self.budget: ForkBudget | None = None  # the enclosing fork's (None: the top run)
        # (router variable id, path into its JSON) -> the literal of this branch
        self.known: dict[RouteKey, str] = {}

    def child(self, ctx: Lowering, budget: ForkBudget, route: RouteKey, literal: str) -> GraphRun:
        """A branch of this run where ``route`` is ``literal``: the state copied, its own
        records, lowering on ``ctx`` (pure)."""
        child = GraphRun(self.app, ctx, self.recursion_limit)
        child.channels = self._copy(self.channels)
        child.depth, child.budget = self.depth + 1, budget
        child.known = {**self.known, route: literal}
        return child

    async def run(self, input: Any) -> Any:
        """Runs the graph from ``input`` to the end; returns the symbolic output."""
        before = self._copy(self.channels)
        writes = self._updates(START, input)
        await self._apply(self.channels, writes)
        self._record(StepRecord(self._values_chunk(writes)))
        tasks = await self._next(before, [(Task(START, input), input, writes)])
        return await self.loop(tasks, 0)

    async def loop(self, tasks: list[Task] | Fork, step: int) -> Any:
        """Runs supersteps from ``tasks`` (the ``step``-th) to the end; the symbolic output,
        a routing.Chosen when the run forked into a server switch."""
        while tasks:
            if isinstance(tasks, Fork):
                budget = self.budget or ForkBudget()
                try:
                    return await fork(self, tasks, step, budget)
                except NotSwitchable as exc:
                    if self.budget is not None:
                        raise  # inside a branch: the outermost fork gives up
                    give_up(self, budget, str(exc))
                    tasks = await tasks.fallback()
                    continue
            if step >= self.recursion_limit:
                raise GraphRecursionError(
                    f"Recursion limit of {self.recursion_limit} reached without hitting a stop "
                    "condition. You can increase the limit by setting the `recursion_limit` "
                    "config key."
                )
            tasks = await self._superstep(tasks)
            step += 1
        return self.output()

    def _record(self, step: StepRecord) -> None:
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)

    # -- reading the state (pure) ---------------------------------------------------------

    def values(self, channels: Channels | None = None, keys: Sequence[str] | None = None) -> dict:
        """The state as a dict of the available channels (all, or ``keys``)."""
        channels = channels or self.channels
        return {
            k: channels[k].get()
            for k in (keys if keys is not None else channels)
            if k in channels and channels[k].is_available()
        }

    def output(self) -> Any:
        """The run's result: the output channels' values, as ``invoke`` returns them."""
        out = self.app.output_channels
        if isinstance(out, str):
            return self.channels[out].get() if self.channels[out].is_available() else None
        return self.values(keys=out)

    def _values_chunk(self, writes: list[tuple[str, Any]]) -> Any:
        """The ``values`` chunk after a step: the stream channels' values, or None (no
        chunk) when the step wrote none of them, as LangGraph streams them."""
        out = self.app.stream_channels_asis
        keys = [out] if isinstance(out, str) else out
        if not any(k in keys for k, _ in writes):
            return None
        if isinstance(out, str):
            return self.channels[out].get()
        return self.values(keys=out)

    def _update_chunk(self, writes: list[tuple[str, Any]]) -> Any:
        """A task's ``updates`` chunk value, as LangGraph's ``map_output_updates``: its
        writes to the stream channels, None when it wrote none."""
        out = self.app.stream_channels_asis
        if isinstance(out, str):
            return next((v for k, v in writes if k == out), None)
        chunk = {k: v for k, v in writes if k in out}
        return chunk or None

    def _node_input(self, task: Task) -> Any:
        if task.sent:
            return task.arg
        spec = self.builder.nodes[task.node]
        keys = self.builder.schemas.get(spec.input_schema)
        return self.values(keys=list(keys) if keys is not None else None)

    # -- a superstep ----------------------------------------------------------------------

    async def _superstep(self, tasks: list[Task]) -> list[Task] | Fork:
        before = self._copy(self.channels)
        inputs = [self._node_input(t) for t in tasks]
        outputs = await self._run_nodes(tasks, inputs)
        done: list[tuple[Task, Any, list[tuple[str, Any]]]] = []
        record = StepRecord({})
        for task, node_input, output in zip(tasks, inputs, outputs, strict=True):
            writes = self._updates(task.node, output)
            done.append((task, node_input, writes))
            if isinstance(task.arg, MapTask):
                record.mapped.append(len(record.updates))
            record.updates.append((task.node, self._update_chunk(writes)))
        writes = [w for _, _, ws in done for w in ws]
        await self._apply(self.channels, writes)
        record.values = self._values_chunk(writes)
        self._record(record)
        return await self._next(before, done, [o for o in outputs if isinstance(o, Command)])

    async def _run_nodes(self, tasks: list[Task], inputs: list[Any]) -> list[Any]:
        """The step's node outputs, in task order. Python nodes (cuts) run concurrently, as
        LangGraph runs a step's tasks; LCEL nodes are lowered one after the other while they
        wait (lowering only declares, so the graph and its trace come out in task order)."""
        loop = asyncio.get_running_loop()
        pending: dict[int, asyncio.Task[Any]] = {
            i: loop.create_task(self._run_node(t, x))
            for i, (t, x) in enumerate(zip(tasks, inputs, strict=True))
            if is_python_node(self.builder.nodes[t.node].runnable)
        }
        outputs: list[Any] = []
        try:
            for i, (task, node_input) in enumerate(zip(tasks, inputs, strict=True)):
                outputs.append(
                    pending[i] if i in pending else await self._run_node(task, node_input)
                )
            return [await o if isinstance(o, asyncio.Task) else o for o in outputs]
        finally:
            for job in pending.values():
                job.cancel()

    async def _run_node(self, task: Task, node_input: Any) -> Any:
        runnable: Runnable = self.builder.nodes[task.node].runnable
        if isinstance(task.arg, MapTask):  # declared when the router ran
            return task.arg.update
        if is_python_node(runnable):
            if "runtime" in getattr(runnable, "func_accepts", {}):  # as the eager run's
                runnable = runnable.with_config(configurable={CONFIG_KEY_RUNTIME: Runtime()})
                return await self.ctx.cut(runnable, node_input, f"node {task.node!r} is Python")
            # evaluated (function_nodes.py), or a client cut when it must run as Python
            output = await lower(runnable, node_input, self.ctx)
            return await self._concrete_goto(output)
        with self.ctx.trace.nested(f"node {task.node!r}"):
            output = await lower(runnable, node_input, self.ctx)
        router = self.switching and bool(self.builder.branches.get(task.node))
        if isinstance(output, SymParsed) and router:
            # a structured router (``prompt | model.with_structured_output(Router)``): its
            # fields become state keys still symbolic, so the edge may be a server switch
            output = split_fields(output, self.builder.channels) or output
        if output is not None and not isinstance(output, dict | Command):
            output = await self.ctx.resolve(output)  # LangGraph's own error, on the value
        return output

    async def _concrete_goto(self, output: Any) -> Any:
        """A node's output with a Command's ``goto`` (node names) concrete, and anything
        but a state update resolved, as LangGraph's own errors need it."""
        if isinstance(output, Command) and collect_refs(output.goto, []):
            output = replace(output, goto=await self.ctx.resolve(output.goto))
        if output is not None and not isinstance(output, dict | Command):
            output = await self.ctx.resolve(output)
        return output

    def _updates(self, node: str, output: Any) -> list[tuple[str, Any]]:
        """The (key, value) writes of a node's output, as LangGraph's ``_get_updates``."""
        if output is None:
            return []
        keys = self.builder.channels
        if node == START:
            keys = self.builder.schemas.get(self.builder.input_schema, keys)
        if isinstance(output, Command):
            return [(k, v) for k, v in output._update_as_tuples() if k in keys]
        if isinstance(output, dict):
            return [(k, v) for k, v in output.items() if k in keys]
        if get_cached_annotated_keys(type(output)):  # a Pydantic model or dataclass, as eager
            return get_update_as_tuples(output, list(keys))
        raise InvalidUpdateError(f"Expected dict, got {output}")

    async def _apply(self, channels: Channels, writes: list[tuple[str, Any]]) -> None:
        """Writes applied per key with the channel's reducer (mutates ``channels``)."""
        by_key: dict[str, list[Any]] = {}
        for key, value in writes:
            by_key.setdefault(key, []).append(value)
        for key, values in by_key.items():
            channel = channels[key]
            if _needs_concrete(channel, values):
                if channel.is_available() and collect_refs(channel.get(), []):
                    channel = channel.from_checkpoint(await self.ctx.resolve(channel.get()))
                    channels[key] = channel
                values = await self.ctx.resolve(values)
            channel.update(values)
        for key, channel in channels.items():
            if key not in by_key:  # as LangGraph's apply_writes: an ephemeral value clears
                channel.update([])

    # -- what runs next ---------------------------------------------------------------------

    async def _next(
        self,
        before: Channels,
        done: list[tuple[Task, Any, list[tuple[str, Any]]]],
        commands: Sequence[Command] = (),
    ) -> list[Task] | Fork:
        names: dict[str, None] = {}
        sends: list[Task] = []
        switch: tuple[SwitchPoint, Any, Any, Channels] | None = None
        for task, node_input, writes in done:
            for start, end in sorted(self.builder.edges):
                if start == task.node and end != END:
                    names[end] = None
            for branch in self.builder.branches.get(task.node, {}).values():
                fresh = self._copy(before)
                await self._apply(fresh, writes)
                point = None
                if self.switching and switch is None:
                    point = switch_point(
                        self, task.node, branch, self._route_state(branch, node_input, fresh)
                    )
                if isinstance(point, SwitchPoint):
                    switch = (point, branch, node_input, fresh)
                    continue
                if point is None:
                    dests = await self._route(task.node, branch, node_input, fresh)
                else:
                    dests = point
                for dest in dests:
                    self._target(dest, names, sends)
        for command in commands:
            goto = command.goto if isinstance(command.goto, list | tuple) else [command.goto]
            for dest in goto:
                if dest:
                    self._target(dest, names, sends)
        if switch is None:
            return _tasks(names, sends)
        point, branch, node_input, fresh = switch
        cases = {}
        for literal, dests in point.cases.items():
            case_names, case_sends = dict(names), list(sends)
            for dest in dests:
                self._target(dest, case_names, case_sends)
            cases[literal] = _tasks(case_names, case_sends)

        async def fallback() -> list[Task]:  # the router as a client cut, as without a fork
            for dest in await self._route(point.source, branch, node_input, fresh):
                self._target(dest, names, sends)
            return _tasks(names, sends)

        return Fork(point, cases, fallback)

    def _route_state(self, branch: Any, node_input: Any, fresh: Channels) -> dict[str, Any]:
        """The state a router reads: the fresh channels, over the node's input when the
        router has no schema of its own (pure)."""
        value = self.values(fresh)
        if isinstance(node_input, dict) and branch.input_schema is None:
            value = {**node_input, **value}
        return value

    async def _route(self, source: str, branch: Any, node_input: Any, fresh: Channels) -> list[Any]:
        """The destinations of ``branch`` (leaving node ``source``): a server map for a
        SendEach over a constrained list (fanout.py), else the router evaluated over the
        symbolic state (or a client cut over the resolved one); a destination that is a
        server value still pending is fetched, a graph break (noted in the trace)."""
        value = self._route_state(branch, node_input, fresh)
        fan = getattr(branch.path, "func", None)
        if isinstance(fan, SendEach):
            mapped = await lower_send_each(self, fan, value)
            if mapped is not None:
                return [mapped]
        # the router evaluated (function_nodes.py; a cut when it must run as Python): its
        # destinations concrete, a Send's argument may stay symbolic
        result = await lower(branch.path, value, self.ctx)
        result = list(result) if isinstance(result, list | tuple) else [result]
        named = collect_refs([r for r in result if not isinstance(r, Send)], [])
        if any(ref.var.state is not VarState.READY for ref in named):
            why = "its destination is a server value (fetched, one frame)"
            self.ctx.trace.graph_break(f"router after {source!r}", why)
        result = [r if isinstance(r, Send) else await self.ctx.resolve(r) for r in result]
        if branch.ends:
            result = [r if isinstance(r, Send) else branch.ends[r] for r in result]
        if any(dest is None or dest == START for dest in result):
            raise ValueError("Branch did not return a valid destination")
        if any(isinstance(d, Send) and d.node == END for d in result):
            raise InvalidUpdateError("Cannot send a packet to the END node")
        return result

    def _target(self, dest: Any, names: dict[str, None], sends: list[Task]) -> None:
        if isinstance(dest, MapTask):
            sends.append(Task(dest.node, dest, sent=True))
        elif isinstance(dest, Send):
            sends.append(Task(dest.node, dest.arg, sent=True))
        elif dest != END:
            names[dest] = None

    @staticmethod
    def _copy(channels: Channels) -> Channels:
        return {k: c.copy() for k, c in channels.items()}


def _tasks(names: dict[str, None], sends: list[Task]) -> list[Task]:
    """A step's next tasks in LangGraph's order: it applies a step's writes sorted by task
    path, pulled nodes by name, then the sends in order; this gives the same reducer order
    (pure)."""
    return [Task(name) for name in sorted(names)] + sends


def _needs_concrete(channel: BaseChannel, values: list[Any]) -> bool:
    """Whether a reducer must see concrete values: all but ``operator.add`` over lists and
    plain last-value channels, which only place values (pure)."""
    if not isinstance(channel, BinaryOperatorAggregate):
        return False
    if channel.operator is operator.add and all(isinstance(v, list) for v in values):
        return False
    return bool(collect_refs(values, [])) or bool(
        channel.is_available() and collect_refs(channel.get(), [])
    )
