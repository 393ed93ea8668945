"""Lowerings of LangChain's composition runnables: they only route symbolic values.

Sequence, parallel maps (dict literals), passthrough, ``.assign``, ``.pick``, ``.map()``
(RunnableEach, unrolled over the concrete input list) and ``.bind``/``.with_config``
wrappers around a lowerable runnable.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.language_models import chat_models
from langchain_core.runnables import (
    RunnableBinding,
    RunnableParallel,
    RunnablePassthrough,
    RunnableSequence,
)
from langchain_core.runnables.base import RunnableEach
from langchain_core.runnables.passthrough import RunnableAssign, RunnablePick

from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.compiler.registry import lower, register
from eclectus.adapters.langchain.errors import NotLowerable


@register(RunnableSequence)
async def lower_sequence(seq: RunnableSequence, value: Any, ctx: Lowering) -> Any:
    with ctx.trace.nested("sequence"):
        for step in seq.steps:
            value = await lower(step, value, ctx)
    return value


@register(RunnableParallel)
async def lower_parallel(par: RunnableParallel, value: Any, ctx: Lowering) -> dict[str, Any]:
    with ctx.trace.nested(f"parallel {list(par.steps__)}"):
        # gather: branches that cut run their client functions concurrently, as LangChain's
        # parallel does; branches without cuts only declare and return at once.
        outputs = await asyncio.gather(*(lower(step, value, ctx) for step in par.steps__.values()))
    return dict(zip(par.steps__, outputs, strict=True))


@register(RunnablePassthrough)
async def lower_passthrough(passthrough: RunnablePassthrough, value: Any, ctx: Lowering) -> Any:
    if passthrough.func is not None or passthrough.afunc is not None:
        raise NotLowerable("a passthrough with a side-effect function")
    ctx.trace.node("passthrough")
    return value


@register(RunnableAssign)
async def lower_assign(assign: RunnableAssign, value: Any, ctx: Lowering) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise NotLowerable("assign needs a dict input")
    with ctx.trace.nested("assign"):
        mapped = await lower(assign.mapper, value, ctx)
    return {**value, **mapped}


@register(RunnablePick)
async def lower_pick(pick: RunnablePick, value: Any, ctx: Lowering) -> Any:
    if not isinstance(value, dict):
        raise NotLowerable("pick needs a dict input")
    ctx.trace.node(f"pick {pick.keys!r}")
    if isinstance(pick.keys, str):
        return value.get(pick.keys)
    picked = {key: value.get(key) for key in pick.keys if key in value}
    return picked or None


@register(RunnableEach)
async def lower_each(each: RunnableEach, value: Any, ctx: Lowering) -> list[Any]:
    if not isinstance(value, list):
        raise NotLowerable("map needs a list input")
    with ctx.trace.nested(f"map over {len(value)} item(s)"):
        return list(await asyncio.gather(*(lower(each.bound, item, ctx) for item in value)))


# Chat models' .bind returns a private RunnableBinding subclass that only adds a model-typed
# OutputType; it binds exactly like its base.
_CHAT_BINDING = getattr(chat_models, "_ChatModelBinding", RunnableBinding)


@register(RunnableBinding, _CHAT_BINDING)
async def lower_binding(binding: RunnableBinding, value: Any, ctx: Lowering) -> Any:
    from eclectus.adapters.langchain.compiler.leaves import MODEL_TYPES, lower_model

    if isinstance(binding.bound, MODEL_TYPES):
        return await lower_model(binding.bound, value, ctx, dict(binding.kwargs))
    if binding.kwargs:
        raise NotLowerable(f"{binding.bound.get_name()} bound with arguments")
    return await lower(binding.bound, value, ctx)
