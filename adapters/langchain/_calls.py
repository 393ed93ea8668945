"""Running prompts on the server for the drop-in models: single, batched, prefetched.

``ModelCore`` is the logic both model classes share once a prompt is pieces: declare the
call on the right session, fetch, retry, stream. A batch's prompts are declared together and
fetched with one ``get_many`` (one submit frame: the server sees them as one group).

``prefetched``: ``ChatEclectus.batch`` resolves every prompt of a batch at once and then
lets LangChain's own batch run its per-input path (callbacks, caching, tracing); each
``_generate`` first looks for its prefetched result here, keyed by the exact prompt text and
sampling payload, so nothing is computed twice and nothing differs from a single invoke.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from eclectus.adapters.langchain import _client
from eclectus.adapters.langchain._client import Generated
from eclectus.adapters.langchain._common import EclectusParams
from eclectus.adapters.langchain.chat_format import ChatTemplate
from eclectus.adapters.langchain.pieces import Piece, concrete_text

PrefetchKey = tuple[str, str, str | None]
_PREFETCH: ContextVar[dict[PrefetchKey, list[Generated]] | None] = ContextVar(
    "eclectus_prefetch", default=None
)


def prefetch_key(
    pieces: Sequence[Piece], sampling: dict[str, Any], model: str | None
) -> PrefetchKey:
    """The identity of a request: its exact text, sampling payload and model (pure)."""
    return (concrete_text(pieces), json.dumps(sampling, sort_keys=True), model)


def take_prefetched(key: PrefetchKey) -> Generated | None:
    """Pops a prefetched result for ``key`` (mutates the current batch's table)."""
    table = _PREFETCH.get()
    if not table or not table.get(key):
        return None
    return table[key].pop(0)  # list.pop is atomic under the GIL: batch threads share it


def set_prefetched(results: dict[PrefetchKey, list[Generated]]) -> Any:
    """Installs a batch's results for the current context; returns the reset token."""
    return _PREFETCH.set(results)


def reset_prefetched(token: Any) -> None:
    _PREFETCH.reset(token)


class ModelCore:
    """Declare, fetch and stream calls for one model configuration. Stateless."""

    def __init__(self, params: EclectusParams, app: str | None) -> None:
        self.params = params
        self.app = params.app_name or app
        self.objective = _client.Objective(params.criteria, params.deadline_ms)

    def session(self) -> _client.SyncSession:
        return _client.session_for(self.params.eclectus_url, self.params.token, self.app)

    def chat_template(self, model: str | None) -> ChatTemplate:
        """The chat template the server announced for ``model`` (blocking: connects on
        first use, with the model's retries)."""
        return _client.with_retries(
            self.params.max_retries,
            lambda: ChatTemplate.of(_client.model_info(self.session(), model)),
        )

    def _declare_all(
        self, requests: Sequence[tuple[Sequence[Piece], dict[str, Any]]], model: str | None
    ) -> tuple[_client.SyncSession, list[_client.SemanticVariable], str]:
        session = self.session()
        outputs = [_client.declare(session, p, s, model) for p, s in requests]
        return session, outputs, _client.model_name_of(session, model)

    def run(
        self, requests: Sequence[tuple[Sequence[Piece], dict[str, Any]]], model: str | None
    ) -> list[Generated]:
        """Runs the requests as one group and waits for all (blocking)."""

        def attempt() -> list[Generated]:
            session, outputs, name = self._declare_all(requests, model)
            return _client.fetch(
                session, outputs, name, self.params.request_timeout, self.objective
            )

        return _client.with_retries(self.params.max_retries, attempt)

    async def arun(
        self, requests: Sequence[tuple[Sequence[Piece], dict[str, Any]]], model: str | None
    ) -> list[Generated]:
        """Async twin of :meth:`run`."""

        async def attempt() -> list[Generated]:
            session, outputs, name = self._declare_all(requests, model)
            return await _client.afetch(
                session, outputs, name, self.params.request_timeout, self.objective
            )

        return await _client.awith_retries(self.params.max_retries, attempt)

    def stream(
        self, pieces: Sequence[Piece], sampling: dict[str, Any], model: str | None
    ) -> Iterator[str | Generated]:
        """Text deltas, then the finished call's Generated record (blocking)."""
        session, (var,), name = self._declare_all([(pieces, sampling)], model)
        parts: list[str] = []
        timeout, criteria = self.params.request_timeout, self.params.criteria
        for delta in _client.stream(session, var, timeout, criteria):
            parts.append(delta)
            yield delta
        yield _client.result_of(var, "".join(parts), name)

    async def astream(
        self, pieces: Sequence[Piece], sampling: dict[str, Any], model: str | None
    ) -> AsyncIterator[str | Generated]:
        """Async twin of :meth:`stream`."""
        session, (var,), name = self._declare_all([(pieces, sampling)], model)
        parts: list[str] = []
        async for delta in _client.astream(session, var, self.params.criteria):
            parts.append(delta)
            yield delta
        yield _client.result_of(var, "".join(parts), name)

    def count_tokens(self, text: str, model: str | None) -> int:
        """The server tokenizer's count for ``text`` (blocking)."""
        return self.session().count_tokens(text, model=model, timeout=self.params.request_timeout)
