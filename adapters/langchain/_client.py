"""The LangChain adapter's calls in SDK terms: prompt pieces to a declared call, finished
variables to the records the model classes report.

Sessions, retries, timeouts and the criteria of the gets are the shared client layer's
(:mod:`eclectus.adapters.connection`, :mod:`eclectus.adapters.calls`), the same as the
LlamaIndex adapter's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from eclectus.adapters.client import Gen, SemanticVariable, SyncSession
from eclectus.adapters.langchain.pieces import Piece, Ref, Value
from eclectus.protocol import ModelCard, SamplingParams


class Serving(Protocol):
    """What answers "which models are served": a session, sync or async."""

    @property
    def models(self) -> list[ModelCard]: ...


def declare(
    session: SyncSession,
    pieces: Sequence[Piece],
    sampling: SamplingParams,
    model: str | None,
    add_special_tokens: bool = True,
) -> SemanticVariable:
    """Declares one call: the pieces as segments, then one generated output (no I/O).
    ``add_special_tokens`` False: the pieces are a chat template's render.

    A :class:`Value` is sent as its own text segment: its seams are possible pin points.
    """
    parts: list[str | SemanticVariable | Gen] = []
    for piece in pieces:
        if isinstance(piece, Ref):
            parts.append(piece.var)
        else:
            parts.append(piece.text if isinstance(piece, Value) else piece)
    parts.append(Gen(sampling=sampling))
    (output,) = session.call(parts, model=model, add_special_tokens=add_special_tokens)
    return output


@dataclass(frozen=True, slots=True)
class Generated:
    """One finished call, as the models report it."""

    text: str
    model_name: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None


def result_of(var: SemanticVariable, text: str, model: str | None) -> Generated:
    """The Generated record of a variable whose text has arrived (pure)."""
    usage = var.usage
    return Generated(
        text=text,
        model_name=model_name_of(var.session, model),
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        cached_tokens=usage.cached_tokens if usage else 0,
        finish_reason=var.finish_reason,
    )


def model_name_of(session: Serving, model: str | None) -> str:
    """The name the server runs a call under: the requested model or its default."""
    if model:
        return model
    return session.models[0].name if session.models else "default"


def model_info(models: Sequence[ModelCard], model: str | None) -> ModelCard | None:
    """The welcome's entry for ``model`` among ``models`` (a session's); the server's first
    model when the name is not announced (a server runs every call on its model), None when
    it announces none (pure)."""
    for info in models:
        if info.name == model:
            return info
    return models[0] if models else None
