"""The symbolic values the evaluator adds to the chain compiler's (symbols.py).

A model's output is a :class:`~eclectus.adapters.langchain.pieces.Ref` (its text), a
``SymMessage`` (an ``AIMessage`` around it) or a ``SymParsed`` (a structured output, or one
field of it). Python code then builds on them: :class:`SymText` is a ``str`` made of
constant text and refs (an f-string, a ``+``, a ``join``), :class:`SymChat` a chat message
whose content is one, :class:`Deferred` an awaitable whose result is symbolic (an
``ainvoke``, an ``async def`` helper not awaited yet). Everything else is an ordinary
Python value, possibly a list, tuple or dict holding symbolic ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from eclectus.adapters.langchain.compiler.symbols import Derived, SymParsed, rebuild
from eclectus.adapters.langchain.pieces import Ref, Symbolic

TextPart = str | Ref


@dataclass(frozen=True, slots=True, eq=False)
class SymText(Derived):
    """A ``str`` to be: ``parts`` concatenated (at least one ref among them)."""

    parts: tuple[TextPart, ...]

    def refs(self) -> list[Ref]:
        return [p for p in self.parts if isinstance(p, Ref)]

    def concrete(self, texts: Mapping[int, str]) -> str:
        return "".join(texts[id(p)] if isinstance(p, Ref) else p for p in self.parts)


@dataclass(frozen=True, slots=True, eq=False)
class SymChat(Derived):
    """``cls(content=text)``, a chat message whose content is symbolic text."""

    cls: type[BaseMessage]
    parts: tuple[TextPart, ...]

    def refs(self) -> list[Ref]:
        return [p for p in self.parts if isinstance(p, Ref)]

    def concrete(self, texts: Mapping[int, str]) -> BaseMessage:
        return self.cls(content=SymText(self.parts).concrete(texts))


@dataclass(eq=False)
class Deferred(Symbolic):
    """An awaitable the evaluator holds: awaiting it evaluates ``thunk`` (once) to its
    symbolic result. ``real`` makes the eager coroutine instead, for code the evaluator
    hands it to (``asyncio.create_task``...)."""

    thunk: Callable[[], Any]
    real: Callable[[], Any]
    done: bool = False
    result: Any = None
    awaited: bool = False  # by an ``await`` (a coroutine is awaited once)

    def value(self) -> Any:
        """The result, evaluated on first use (mutates)."""
        if not self.done:
            self.result, self.done = self.thunk(), True
        return self.result


def text_parts(parts: list[TextPart]) -> tuple[TextPart, ...]:
    """``parts`` with adjacent constants merged and empty ones dropped (pure)."""
    out: list[TextPart] = []
    for part in parts:
        if isinstance(part, str):
            if not part:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += part
                continue
        out.append(part)
    return tuple(out)


def make_text(parts: list[TextPart]) -> str | Ref | SymText:
    """The value ``parts`` concatenate to: a ``str`` when all are constant, the ref itself
    when it is alone, else a SymText (pure)."""
    merged = text_parts(parts)
    if not any(isinstance(p, Ref) for p in merged):
        return "".join(merged)  # type: ignore[arg-type]
    if len(merged) == 1:
        return merged[0]
    return SymText(merged)


def is_symbolic(value: Any) -> bool:
    """Whether ``value`` is, or holds in a list, tuple, dict, ``Send`` or ``Command``, a
    value not known on the client yet (pure)."""
    if isinstance(value, Symbolic):
        return True
    if isinstance(value, list | tuple):
        return any(is_symbolic(v) for v in value)
    if isinstance(value, dict):
        return any(is_symbolic(v) for v in value.values())
    holder = _held(value)
    return holder is not None and any(is_symbolic(v) for v in holder)


def _held(value: Any) -> tuple[Any, ...] | None:
    """What a LangGraph ``Send`` or ``Command`` carries, which may be symbolic."""
    from langgraph.types import Command, Send

    if isinstance(value, Send):
        return (value.arg,)
    if isinstance(value, Command):
        return (value.update, value.goto)
    return None


def parsed_rebuild(value: SymParsed, text: str) -> Any:
    """A structured output (or its field) once its reply's text is known (pure)."""
    return rebuild(value, {id(value.ref): text})
