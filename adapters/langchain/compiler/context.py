"""Lowering: the state of one compiled run (session, mode, config, trace) and the three
things lowerings need from it: declare server work, resolve values, and cut."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.runnables import Runnable, RunnableConfig

from eclectus.adapters.calls import CallOptions
from eclectus.adapters.client import SyncSession
from eclectus.adapters.langchain import _client
from eclectus.adapters.langchain.compiler.callbacks import CallRecord
from eclectus.adapters.langchain.compiler.graph import GraphTrace
from eclectus.adapters.langchain.compiler.symbols import collect_refs, rebuild
from eclectus.adapters.langchain.errors import NotLowerable
from eclectus.adapters.langchain.pieces import Piece, Ref, Spread
from eclectus.protocol import SamplingParams


@dataclass(slots=True)
class Lowering:
    """One run's lowering context. ``server`` is (ws URL, token) of ``session``: a model
    lowers onto this session only when it talks to the same server."""

    session: SyncSession
    server: tuple[str, str | None]
    mode: Literal["sync", "async"]
    config: RunnableConfig
    trace: GraphTrace = field(default_factory=GraphTrace)
    timeout: float | None = None  # seconds to wait for values (the model's ``timeout``)
    objective: CallOptions = field(default_factory=CallOptions)  # the model's criteria
    cuts: asyncio.Semaphore | None = None  # shared by a run's contexts (see cut_gate)
    calls: list[CallRecord] = field(default_factory=list)  # for callbacks (callbacks.py)
    # SDK variable id -> the literals its call is constrained to (a router's choice), so a
    # LangGraph router over it may run on the server (langgraph/routing.py)
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # SDK variable id -> a variable fetched along with it: a structured reply's field op
    # brings the reply (pyeval/host.py), which the state or callbacks read next anyway
    fetch_with: dict[str, Any] = field(default_factory=dict)

    def declare_call(
        self,
        pieces: Sequence[Piece],
        sampling: SamplingParams,
        model: str | None,
        label: str,
        add_special_tokens: bool = True,
    ) -> Ref:
        """Declares one model call (buffered, nothing sent) and returns its output ref;
        ``add_special_tokens`` False for a chat template's render."""
        self.trace.call(label)
        output = _client.declare(self.session, pieces, sampling, model, add_special_tokens)
        constraint = sampling.structured_outputs if isinstance(sampling, SamplingParams) else None
        if constraint is not None and constraint.choice is not None:
            self.choices[output.id] = constraint.choice
        return Ref(output)

    def repr_list(self, items: list[Any]) -> Ref:
        """``str(items)`` on the server, byte-identical to Python's (declares a repr_list
        op; items are strs and refs)."""
        if any(isinstance(item, Spread) for item in items):
            if len(items) != 1:  # the op spreads one map's output, alone
                raise NotLowerable("a list holding a fan-out's results and other items")
            self.trace.op("repr_list of a fan-out's results")
            return Ref(self.session.session.spread_repr_list(items[0].ref.var))
        self.trace.op(f"repr_list of {len(items)} item(s)")
        parts = [item.var if isinstance(item, Ref) else item for item in items]
        return Ref(self.session.repr_list(parts))

    async def resolve(self, value: Any, extra: Sequence[Any] = ()) -> Any:
        """The concrete twin of a symbolic value: its refs fetched in one frame, together
        with the ``extra`` SDK variables (say, what callbacks need)."""
        refs = collect_refs(value, [])
        wanted = [ref.var for ref in refs] + list(extra)
        texts = (await self.fetch(wanted))[: len(refs)] if wanted else []
        return rebuild(value, {id(ref): text for ref, text in zip(refs, texts, strict=True)})

    async def fetch(self, variables: list[Any]) -> list[str]:
        """The texts of SDK variables, pending declarations shipped in the same frame, with
        the variables ``fetch_with`` names for them (their texts are not returned: a later
        fetch finds them ready and sends nothing)."""
        along = (self.fetch_with.get(var.id) for var in variables)
        wanted = list(variables)
        wanted += [v for v in dict.fromkeys(along) if v is not None and v not in wanted]
        gets = self.session.session.aget_many(
            wanted, self.objective.criteria, deadline_ms=self.objective.deadline_ms
        )
        return (await asyncio.wait_for(gets, self.timeout))[: len(variables)]

    async def cut(self, runnable: Runnable, value: Any, reason: str) -> Any:
        """Runs ``runnable`` on the client over the resolved input; its output is concrete
        (it travels back to the server as constant text wherever it is used)."""
        self.trace.cut(runnable.get_name(), reason)
        concrete = await self.resolve(value)
        async with self.cuts or contextlib.nullcontext():
            if self.mode == "async":
                return await runnable.ainvoke(concrete, self.config)
            return await asyncio.to_thread(runnable.invoke, concrete, self.config)


def cut_gate(config: RunnableConfig) -> asyncio.Semaphore | None:
    """The gate that keeps a run's client cuts within the config's ``max_concurrency``, as
    LangChain's own batch would (None: no limit beyond the default thread pool's)."""
    limit = config.get("max_concurrency")
    return asyncio.Semaphore(limit) if limit else None
