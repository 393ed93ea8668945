"""LangChain callbacks for the model calls of a compiled run, as the eager run fires them.

An eager chain fires, per model call, ``on_chat_model_start`` (``on_llm_start`` for a
completion model) with the messages the model received, then ``on_llm_end`` with the
generation (its message carries ``usage_metadata``) or ``on_llm_error``. A compiled run
declares its calls instead of running them, so the lowering records each one
(:class:`CallRecord`) and :func:`fire` replays the events once the values are known: tracing,
token counters and cost callbacks see every call. Only when a handler is configured are the
intermediate values (prompts with generated inputs, outputs nobody asked for) fetched, with
the run's final values (:func:`pending_vars`); without handlers nothing more comes back.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import AsyncCallbackManager, CallbackManager
from langchain_core.load import dumpd
from langchain_core.outputs import ChatGeneration, Generation, LLMResult
from langchain_core.runnables import RunnableConfig

from eclectus.adapters.client.variables import VarState
from eclectus.adapters.langchain.compiler.symbols import ai_message, collect_refs, rebuild
from eclectus.adapters.langchain.pieces import Ref, SymMessage
from eclectus.adapters.langchain.tracing import PromptTracer


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One declared model call: the model, its symbolic input, its symbolic output (a
    SymMessage for a chat model, a Ref for a completion model), the ``.bind`` kwargs."""

    model: Any
    input: Any
    output: SymMessage | Ref
    kwargs: dict[str, Any]

    @property
    def ref(self) -> Ref:
        return self.output.ref if isinstance(self.output, SymMessage) else self.output


def _manager(record: CallRecord, config: RunnableConfig, mode: str) -> Any:
    cls = AsyncCallbackManager if mode == "async" else CallbackManager
    model = record.model
    return cls.configure(
        config.get("callbacks"),
        model.callbacks,
        model.verbose,
        config.get("tags"),
        model.tags,
        config.get("metadata"),
        model.metadata,
    )


def wanted(records: list[CallRecord], config: RunnableConfig) -> bool:
    """Whether any handler would see these calls (pure). Our own prompt tracer, active in
    every manager, does not count: it only watches prompt runs."""
    return any(
        not isinstance(handler, PromptTracer)
        for record in records
        for handler in _manager(record, config, "sync").handlers
    )


def pending_vars(records: list[CallRecord], config: RunnableConfig) -> list[Any]:
    """The SDK variables :func:`fire` will need that are not known yet, when a handler
    wants these calls ([] otherwise), so a run can fetch them with its final values, in
    the same frame (pure)."""
    if not records or not wanted(records, config):
        return []
    refs = collect_refs([(r.input, r.output) for r in records], [])
    return list(dict.fromkeys(r.var for r in refs if r.var.state is VarState.PENDING))


async def fire(records: list[CallRecord], config: RunnableConfig, mode: str, fetch: Any) -> None:
    """Fires start and end (or error) per call whose output is final (READY or FAILED);
    ``fetch(vars)`` gets the texts still pending, in one frame. No-op without handlers."""
    if not records or not wanted(records, config):
        return
    refs = collect_refs([(r.input, r.output) for r in records], [])
    pending = [ref.var for ref in refs if ref.var.state is VarState.PENDING]
    if pending:
        # a failed call gets on_llm_error below; the run raises on its own
        with contextlib.suppress(Exception):
            await fetch(list(dict.fromkeys(pending)))
    table = {id(ref): ref.var.value for ref in refs if ref.var.state is VarState.READY}
    for record in records:
        if record.ref.var.state is not VarState.PENDING:
            await fire_one(record, config, mode, table)


async def fire_one(
    record: CallRecord, config: RunnableConfig, mode: str, table: dict[int, Any]
) -> None:
    """Fires one call's start and end (or error); ``table`` maps ``id(ref)`` to the text
    of each ref in its input (a missing one: an input failed, nothing fires)."""
    model, var = record.model, record.ref.var
    inputs = collect_refs(record.input, [])
    if any(id(ref) not in table for ref in inputs):
        return  # an input failed: the eager model would not have been called either
    prompt = model._convert_input(rebuild(record.input, table))
    manager = _manager(record, config, mode)
    own = getattr(model, "_get_invocation_params", None)  # a chat model's; an LLM's asdict()
    params = {**(own(**record.kwargs) if own else model.asdict()), **record.kwargs}
    serialized = dumpd(model)
    if isinstance(record.output, SymMessage):
        start = manager.on_chat_model_start(
            serialized, [prompt.to_messages()], invocation_params=params, batch_size=1
        )
    else:
        start = manager.on_llm_start(
            serialized, [prompt.to_string()], invocation_params=params, batch_size=1
        )
    (run,) = await start if mode == "async" else start
    if var.state is VarState.FAILED:
        done = run.on_llm_error(var.error or RuntimeError("the call failed"))
    elif isinstance(record.output, SymMessage):
        message = ai_message(record.output, var.value or "")
        done = run.on_llm_end(LLMResult(generations=[[ChatGeneration(message=message)]]))
    else:
        done = run.on_llm_end(LLMResult(generations=[[Generation(text=var.value or "")]]))
    if mode == "async":
        await done
