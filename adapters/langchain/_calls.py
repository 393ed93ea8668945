"""Running prompts on the server for the drop-in models: single, batched, prefetched.

``ModelCore`` is the logic both model classes share once a prompt is pieces: declare the
call and ask for it through the shared client layer (:mod:`eclectus.adapters.calls`: the
session, retries, request timeout, criteria and deadline of every path). A batch's prompts
are declared together and fetched with one ``get_many`` (one submit frame: the server sees
them as one group).

``prefetched``: ``ChatEclectus.batch`` resolves every prompt of a batch at once and then
lets LangChain's own batch run its per-input path (callbacks, caching, tracing); each
``_generate`` first looks for its prefetched result here, keyed by the exact prompt text and
sampling payload, so nothing is computed twice and nothing differs from a single invoke.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextvars import ContextVar
from typing import Any

from eclectus.adapters.calls import Caller
from eclectus.adapters.client import SemanticVariable, SyncSession
from eclectus.adapters.connection import connection_for
from eclectus.adapters.langchain import _client
from eclectus.adapters.langchain._client import Generated
from eclectus.adapters.langchain._common import EclectusParams
from eclectus.adapters.langchain.chat_format import ChatTemplate
from eclectus.adapters.langchain.pieces import Piece, concrete_text
from eclectus.protocol import SamplingParams

Request = tuple[Sequence[Piece], SamplingParams]  # one call's prompt pieces and sampling

PrefetchKey = tuple[str, str, str | None]
_PREFETCH: ContextVar[dict[PrefetchKey, list[Generated]] | None] = ContextVar(
    "eclectus_prefetch", default=None
)


def prefetch_key(
    pieces: Sequence[Piece], sampling: SamplingParams, model: str | None
) -> PrefetchKey:
    """The identity of a request: its exact text, sampling and model (pure)."""
    return (concrete_text(pieces), sampling.model_dump_json(), model)


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
    """Declare, fetch and stream calls for one model configuration, in the application
    ``app`` (the model's ``app_name`` wins). Stateless apart from the shared session.

    Its calls are async; a sync entry point blocks on them with :meth:`block` and
    :meth:`iterate` (the shared client layer's bridge)."""

    def __init__(self, params: EclectusParams, app: str | None) -> None:
        self.params = params
        self.app = params.app_name or app
        self.add_special_tokens = not params.renders_chat
        connection = connection_for(params.eclectus_url, params.token, self.app)
        self.caller = Caller(connection, params.call_options())
        self.block = self.caller.block
        self.iterate = self.caller.iterate

    def session(self) -> SyncSession:
        """The application's session (blocking: connects on first use)."""
        return self.caller.session

    def chat_template(self, model: str | None) -> ChatTemplate:
        """The chat template the server announced for ``model`` (no I/O once a session is
        open; else blocking: connects, with the model's retries)."""
        return ChatTemplate.of(_client.model_info(self.caller.served_models(), model))

    async def arun(self, requests: Sequence[Request], model: str | None) -> list[Generated]:
        """Runs the requests as one group and waits for all."""
        pairs = await self.caller.arun(self._declarer(requests, model))
        return [_client.result_of(var, text, model) for var, text in pairs]

    async def astream(
        self, pieces: Sequence[Piece], sampling: SamplingParams, model: str | None
    ) -> AsyncIterator[str | Generated]:
        """Text deltas, then the finished call's Generated record."""
        parts: list[str] = []
        async for item in self.caller.astream(self._declarer_one(pieces, sampling, model)):
            if isinstance(item, str):
                parts.append(item)
                yield item
            else:
                yield _client.result_of(item, "".join(parts), model)

    def count_tokens(self, text: str, model: str | None) -> int:
        """The server tokenizer's count for ``text`` (blocking)."""

        async def count(session: SyncSession) -> int:
            counting = session.session.count_tokens(text, model=model)
            return await asyncio.wait_for(counting, self.params.request_timeout)

        return self.block(lambda: self.caller.aretrying(count))

    def _declarer(
        self, requests: Sequence[Request], model: str | None
    ) -> Callable[[SyncSession], list[SemanticVariable]]:
        special = self.add_special_tokens
        return lambda session: [_client.declare(session, p, s, model, special) for p, s in requests]

    def _declarer_one(
        self, pieces: Sequence[Piece], sampling: SamplingParams, model: str | None
    ) -> Callable[[SyncSession], SemanticVariable]:
        special = self.add_special_tokens
        return lambda session: _client.declare(session, pieces, sampling, model, special)
