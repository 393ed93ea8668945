"""The evaluator's link to its run: lowering, server ops, fetching (graph breaks), awaiting.

The evaluator runs app code on a worker thread (so the app's blocking calls block only it,
and a lazily consumed generator may still fetch); the run's lowering context lives on the
run's event loop. :class:`Host` carries each request over: :meth:`lower` a runnable
(declares, sends nothing), :meth:`text_op` a server op, :meth:`concrete` a value's
symbolic parts fetched in one frame (a *graph break*, recorded with where and why) and
written back in place, so the containers the app holds keep their identity, and every
later use of a fetched value sees the same concrete object (``memo``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from langgraph.types import Command, Send

from eclectus.adapters.client.variables import VarState
from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.compiler.registry import lower
from eclectus.adapters.langchain.compiler.symbols import Derived, SymParsed, rebuild
from eclectus.adapters.langchain.pieces import Ref, Spread, Symbolic, SymMessage
from eclectus.adapters.pyeval.values import Deferred, SymText, is_symbolic

T = TypeVar("T")
MAX_DEPTH = 8  # nested helper evaluations; deeper helpers run as Python


@dataclass(slots=True)
class Host:
    """One evaluation's link to its run (mutated as the evaluation goes)."""

    ctx: Lowering
    loop: asyncio.AbstractEventLoop
    memo: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # id(sym) -> (sym, value)
    refs: dict[int, tuple[Any, Ref]] = field(default_factory=dict)  # id(sym str) -> its ref
    depth: int = 0
    num_breaks: int = 0
    # containers this evaluation made (id -> the object, kept alive): the only ones, with
    # those already holding symbolic values, that may be given one (see may_hold)
    local: dict[int, Any] = field(default_factory=dict)

    # -- who may hold a symbolic value ------------------------------------------------------

    def own(self, value: T) -> T:
        """Marks a container the evaluation made (mutates ``local``); returns it."""
        self.local[id(value)] = value
        return value

    def may_hold(self, owner: Any) -> bool:
        """Whether a symbolic value may be stored into ``owner``: a list or dict the
        evaluation made, or one holding symbolic values already (the run's state). Any
        other container is the app's, seen outside the evaluation: it gets values
        concrete (pure)."""
        if type(owner) not in (list, dict):
            return False
        return id(owner) in self.local or is_symbolic(owner)

    # -- the run's loop -----------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` run on the run's loop; this (worker) thread waits for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def lower(self, runnable: Any, value: Any) -> Any:
        """The symbolic output of ``runnable`` on ``value`` (the chain compiler's lowering:
        declares calls, or runs a cut)."""
        return self.run(lower(runnable, value, self.ctx))

    def lower_model(self, model: Any, value: Any, kwargs: dict[str, Any]) -> Any:
        """One declared call of ``model`` (bound with ``kwargs``) on ``value``."""
        from eclectus.adapters.langchain.compiler.leaves import lower_model

        async def declare() -> Any:
            return await lower_model(model, value, self.ctx, kwargs)

        return self.run(declare())

    def await_(self, awaitable: Any) -> Any:
        """``await awaitable`` as the app would: a Deferred evaluates, anything else is
        awaited on the run's loop (its errors are Python's)."""
        if isinstance(awaitable, Deferred):
            if awaitable.awaited:
                raise RuntimeError("cannot reuse already awaited coroutine")
            awaitable.awaited = True
            return awaitable.value()

        async def wait() -> Any:
            return await awaitable

        return self.run(wait())

    def on_loop(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        """``func(*args, **kwargs)`` called on the run's loop thread, where asyncio's
        ``create_task`` and friends need to be called (this thread runs no loop)."""

        async def call() -> Any:
            return func(*args, **kwargs)

        return self.run(call())

    # -- server ops ---------------------------------------------------------------------

    def as_ref(self, value: Ref | SymText | SymParsed) -> Ref:
        """One server variable holding ``value``'s text: a ``join`` of a SymText's parts,
        the ``json_field`` of a structured output's string field (fetched along with its
        reply, see ``Lowering.fetch_with``); cached per value (mutates ``refs``)."""
        if isinstance(value, Ref):
            return value
        hit = self.refs.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        session = self.ctx.session.session
        if isinstance(value, SymText):
            parts = [p.var if isinstance(p, Ref) else p for p in value.parts]
            ref = Ref(session.join(parts))
            self.ctx.trace.op(f"join of {len(parts)} part(s) (a Python string)")
        else:
            path = field_path(value)
            ref = Ref(session.text_op("json_field", [value.ref.var], path=path))
            # whoever fetches the field (a break, a router's cut) gets the reply in the
            # same frame: the state and callbacks hold the reply, so it is read next
            self.ctx.fetch_with[ref.var.id] = value.ref.var
            self.ctx.trace.op(f"json_field {path} (a structured output's field)")
        self.refs[id(value)] = (value, ref)
        return ref

    def text_op(
        self, kind: Any, inputs: Sequence[Ref | str], args: Sequence[Any] = (), label: str = ""
    ) -> Ref:
        """A server text op over ``inputs`` (refs or constants); its output's ref."""
        session = self.ctx.session.session
        items = [p.var if isinstance(p, Ref) else p for p in inputs]
        self.ctx.trace.op(label or f"{kind} {list(args)}")
        return Ref(session.text_op(kind, items, args=args))

    def repr_list(self, items: list[Any]) -> Ref:
        """``str(items)`` of strings and refs, on the server (the chain compiler's op)."""
        return self.ctx.repr_list(items)

    # -- graph breaks -----------------------------------------------------------------------

    def current(self, value: Any) -> Any:
        """``value``, or its concrete twin when it was fetched already (pure)."""
        if isinstance(value, Symbolic):
            hit = self.memo.get(id(value))
            if hit is not None and hit[0] is value:
                return hit[1]
        return value

    def concrete(self, value: Any, where: str, reason: str, extra: Sequence[Any] = ()) -> Any:
        """``value`` with every symbolic part fetched (one frame for all, with the SDK
        variables ``extra``; a graph break at ``where`` unless ``where`` is empty: the
        run's final fetch) and written back in place (mutates ``value``'s containers and
        the memo). Raises what a failed server value raises."""
        value = self.current(value)
        if not is_symbolic(value) and not extra:
            return value
        refs: list[Ref] = []
        self._collect(value, refs)
        table: dict[int, str] = {}
        if refs or extra:
            if where and any(ref.var.state is not VarState.READY for ref in refs):
                self.num_breaks += 1  # a frame: the pending values are fetched now
                self.ctx.trace.graph_break(where, reason)
            texts = self.run(self.ctx.resolve(refs, extra))
            table = {id(ref): text for ref, text in zip(refs, texts, strict=True)}
        return self._rebuild(value, table)

    def _collect(self, value: Any, out: list[Ref]) -> None:
        value = self.current(value)
        if isinstance(value, Ref):
            out.append(value)
        elif isinstance(value, SymMessage | Spread | SymParsed):
            out.append(value.ref)
        elif isinstance(value, Derived):
            out.extend(value.refs())
        elif isinstance(value, Deferred):
            if value.done:
                self._collect(value.result, out)
        elif isinstance(value, Symbolic):  # a SymPrompt
            from eclectus.adapters.langchain.compiler.symbols import collect_refs

            collect_refs(value, out)
        elif isinstance(value, list | tuple):
            for item in value:
                self._collect(item, out)
        elif isinstance(value, dict):
            for item in value.values():
                self._collect(item, out)
        elif isinstance(value, Send):
            self._collect(value.arg, out)
        elif isinstance(value, Command):
            self._collect(value.update, out)
            self._collect(value.goto, out)

    def _rebuild(self, value: Any, texts: Mapping[int, str]) -> Any:
        value = self.current(value)
        if isinstance(value, Deferred):
            return self._real(value, texts)
        if isinstance(value, Symbolic):
            concrete = rebuild(value, texts)
            self.memo[id(value)] = (value, concrete)
            return concrete
        if isinstance(value, list):
            items: list[Any] = []
            for item in value:
                if isinstance(item, Spread):
                    items.extend(rebuild([item], texts))
                else:
                    items.append(self._rebuild(item, texts))
            value[:] = items  # in place: whoever holds this list sees it concrete
            return value
        if isinstance(value, dict):
            for key, item in list(value.items()):
                value[key] = self._rebuild(item, texts)
            return value
        if isinstance(value, tuple):
            return (
                type(value)(*(self._rebuild(v, texts) for v in value))
                if _named(value)
                else tuple(self._rebuild(v, texts) for v in value)
            )
        if isinstance(value, Send):
            return Send(value.node, self._rebuild(value.arg, texts))
        if isinstance(value, Command):
            update = self._rebuild(value.update, texts)
            return replace(value, update=update, goto=self._rebuild(value.goto, texts))
        return value

    def _real(self, deferred: Deferred, texts: Mapping[int, str]) -> Any:
        """The eager awaitable for code outside the evaluator: a coroutine of the result
        when it was evaluated, else the app's own coroutine (it runs as Python)."""
        if deferred.done:
            result = self._rebuild(deferred.result, texts)

            async def ready() -> Any:
                return result

            return ready()
        real = deferred.real()
        assert inspect.isawaitable(real)
        return real


def field_path(value: SymParsed) -> list[str | int]:
    """The JSON path of a structured output's field (attribute names are the JSON keys:
    fields.py admits no aliases)."""
    return list(value.path)


def _named(value: tuple[Any, ...]) -> bool:
    return hasattr(value, "_fields")
