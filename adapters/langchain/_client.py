"""The adapter's one door to the SDK: pooled sessions, calls from pieces, results.

Sessions are opened with the SDK's ``connect_sync`` (a session on a background loop whose
blocking methods work from any thread and whose async methods work from any event loop), so
one session serves ``invoke`` and ``ainvoke`` alike. There is one session per (server URL,
token, application) in the process; a lost connection is dropped from the pool and the call
retried on a fresh one, ``max_retries`` times.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from eclectus.adapters.client import Gen, SemanticVariable, SyncSession, connect_sync
from eclectus.adapters.client.errors import ConnectionError as ClientConnectionError
from eclectus.adapters.langchain.pieces import Piece, Ref, Value
from eclectus.protocol import Criteria, ModelCard

T = TypeVar("T")
SessionKey = tuple[str, str | None, str | None]

_pool_lock = threading.Lock()
_pool: dict[SessionKey, SyncSession] = {}


def ws_url(url: str) -> str:
    """A ``ws(s)://`` URL for a ``ws``/``http`` base URL (an OpenAI-style ``/v1`` suffix of
    a VLLMOpenAI base_url is dropped: the protocol is served on any path). Pure."""
    for old, new in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(old):
            url = new + url[len(old) :]
    return url.removesuffix("/").removesuffix("/v1")


def session_for(url: str, token: str | None, app: str | None) -> SyncSession:
    """The pooled session for (url, token, app), opened on first use (mutates the pool)."""
    key = (ws_url(url), token, app)
    with _pool_lock:
        session = _pool.get(key)
        if session is not None and not session.closed:
            return session
        session = connect_sync(key[0], token=token, app=app)
        _pool[key] = session
        return session


def forget_session(session: SyncSession) -> None:
    """Drops a broken session from the pool so the next call reconnects (mutates)."""
    with _pool_lock:
        for key, pooled in list(_pool.items()):
            if pooled is session:
                del _pool[key]


def declare(
    session: SyncSession, pieces: Sequence[Piece], sampling: dict[str, Any], model: str | None
) -> SemanticVariable:
    """Declares one call: the pieces as segments, then one generated output (no I/O).

    A :class:`Value` is sent as its own text segment: its boundaries are reuse points.
    """
    parts: list[str | SemanticVariable | Gen] = []
    for piece in pieces:
        if isinstance(piece, Ref):
            parts.append(piece.var)
        else:
            parts.append(piece.text if isinstance(piece, Value) else piece)
    parts.append(Gen(**sampling))
    (output,) = session.call(parts, model=model)
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


def result_of(var: SemanticVariable, text: str, model_name: str) -> Generated:
    """The Generated record of a variable whose text has arrived (pure)."""
    usage = var.usage
    return Generated(
        text=text,
        model_name=model_name,
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        cached_tokens=usage.cached_tokens if usage else 0,
        finish_reason=var.finish_reason,
    )


def model_name_of(session: SyncSession, model: str | None) -> str:
    """The name the server runs a call under: the requested model or its default."""
    if model:
        return model
    return session.models[0].name if session.models else "default"


def model_info(session: SyncSession, model: str | None) -> ModelCard | None:
    """The welcome's entry for ``model``; the server's first model when the name is not
    announced (a server runs every call on its model), None when it announces none."""
    for info in session.models:
        if info.name == model:
            return info
    return session.models[0] if session.models else None


def with_retries(max_retries: int | None, attempt: Callable[[], T]) -> T:
    """Runs ``attempt`` again after a lost connection, up to ``max_retries`` more times."""
    for tries_left in range(max_retries or 0, -1, -1):
        try:
            return attempt()
        except ClientConnectionError:
            if tries_left == 0:
                raise
    raise AssertionError("unreachable")


async def awith_retries(max_retries: int | None, attempt: Callable[[], Any]) -> Any:
    """Async twin of :func:`with_retries` (``attempt`` returns an awaitable)."""
    for tries_left in range(max_retries or 0, -1, -1):
        try:
            return await attempt()
        except ClientConnectionError:
            if tries_left == 0:
                raise
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class Objective:
    """What the gets of a model's calls ask the scheduler for (see EclectusParams)."""

    criteria: Criteria = "latency"
    deadline_ms: float | None = None


def fetch(
    session: SyncSession,
    outputs: Sequence[SemanticVariable],
    model_name: str,
    timeout: float | None,
    objective: Objective = Objective(),
) -> list[Generated]:
    """Ships everything pending and waits for ``outputs`` (one frame); forgets the session
    when its connection is lost."""
    try:
        texts = session.get_many(
            outputs, objective.criteria, deadline_ms=objective.deadline_ms, timeout=timeout
        )
    except ClientConnectionError:
        forget_session(session)
        raise
    return [result_of(v, t, model_name) for v, t in zip(outputs, texts, strict=True)]


async def afetch(
    session: SyncSession,
    outputs: Sequence[SemanticVariable],
    model_name: str,
    timeout: float | None,
    objective: Objective = Objective(),
) -> list[Generated]:
    """Async twin of :func:`fetch`."""
    try:
        gets = session.session.aget_many(
            outputs, objective.criteria, deadline_ms=objective.deadline_ms
        )
        texts = await asyncio.wait_for(gets, timeout)
    except ClientConnectionError:
        forget_session(session)
        raise
    return [result_of(v, t, model_name) for v, t in zip(outputs, texts, strict=True)]


def stream(
    session: SyncSession, var: SemanticVariable, timeout: float | None, criteria: Criteria
) -> Iterator[str]:
    """Text deltas of ``var`` (``timeout`` bounds the wait for each)."""
    return session.session.stream(var, criteria, timeout=timeout)


def astream(session: SyncSession, var: SemanticVariable, criteria: Criteria) -> AsyncIterator[str]:
    """Async text deltas of ``var``."""
    return session.session.astream(var, criteria)
