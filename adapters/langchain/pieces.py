"""Prompt pieces: a prompt as the segments it is sent as.

A prompt is a list of pieces. Constant template text is a ``str``; a concrete variable value
is a :class:`Value`; a server-side variable that the client does not know yet is a
:class:`Ref`. Pieces map one to one onto protocol segments (text, constant variable,
variable), so every piece boundary is a seam the server can pin a shared prefix at, and the
same prompt reaches the server the same way whether a chain runs eagerly or compiled (the
server tokenizes its flat text, as a stock server does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Value:
    """A concrete variable value inside a prompt (sent as a constant variable)."""

    text: str


class Symbolic:
    """Marker base of values that are not known on the client yet."""

    __slots__ = ()


@dataclass(frozen=True, slots=True, eq=False)
class Ref(Symbolic):
    """A variable that lives on the server (an SDK ``SemanticVariable``).

    ``eq=False``: two refs are the same only if they are the same object, because two
    variables with equal text so far may still differ in the end.
    """

    var: Any


@dataclass(frozen=True, slots=True, eq=False)
class SymMessage(Symbolic):
    """A chat model's reply whose text is a server-side variable (an ``AIMessage`` to be).

    ``model_name`` is the model that produces it, for the message's response metadata.
    """

    ref: Ref
    model_name: str


@dataclass(frozen=True, slots=True, eq=False)
class Spread(Symbolic):
    """Inside a list, stands for all the items of a list a server-side map produced: ``ref``
    holds their JSON array (the LangGraph compiler's ``Send`` fan-out, docs/langgraph.md)."""

    ref: Ref


Piece = str | Value | Ref


def contains_symbolic(obj: object) -> bool:
    """True when ``obj`` is, or holds in a dict, list or tuple, a value not known yet."""
    if isinstance(obj, Symbolic):
        return True
    if isinstance(obj, dict):
        return any(contains_symbolic(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(contains_symbolic(v) for v in obj)
    return False


def normalize(pieces: Iterable[Piece]) -> list[Piece]:
    """Merge adjacent constant text and drop empty constants (does not mutate ``pieces``).

    Merging matters for exactness: the engine tokenizes each segment on its own, so both the
    eager and the compiled path must cut the prompt at the same places.
    """
    out: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, str):
            if not piece:
                continue
            if out and isinstance(out[-1], str):
                out[-1] = out[-1] + piece
                continue
        elif isinstance(piece, Value) and not piece.text:
            continue
        out.append(piece)
    return out


def concrete_text(pieces: Sequence[Piece]) -> str:
    """The text of concrete pieces; raises ValueError if a piece is a :class:`Ref`."""
    parts: list[str] = []
    for piece in pieces:
        if isinstance(piece, Ref):
            raise ValueError("a prompt piece is a server-side variable, not concrete text")
        parts.append(piece if isinstance(piece, str) else piece.text)
    return "".join(parts)
