"""The blocking twin: a session on a background event-loop thread.

``connect_sync(url)`` starts a daemon thread running its own event loop, opens the session
there and returns a :class:`SyncSession`. Declaring works exactly as in the async API;
asking blocks the calling thread (``var.get()``, ``var.stream()``, ``app.get_many()``).
Because the session lives on its own loop, its variables' async methods (``aget``,
``astream``) also work from any other event loop, so one sync-capable session can serve both
the sync and the async entry points of a framework adapter.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping, Sequence

from eclectus.adapters.client.connect import DEFAULT_RETRIES, DEFAULT_TIMEOUT, open_session
from eclectus.adapters.client.functions import Piece, SamplingLike, SemanticFunction
from eclectus.adapters.client.map_steps import MapSteps
from eclectus.adapters.client.session import Session
from eclectus.adapters.client.variables import SemanticVariable
from eclectus.protocol import Criteria, Limits, ModelCard


class _LoopThread:
    """A daemon thread running one event loop until :meth:`stop`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="eclectus-session", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def stop(self) -> None:
        """Stops and closes the loop, then joins the thread (mutates; idempotent)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not threading.current_thread():
            self._thread.join()


class SyncSession:
    """A Session driven from ordinary threads. ``.session`` is the underlying async Session
    (its async methods work from any event loop)."""

    def __init__(self, session: Session, loop_thread: _LoopThread) -> None:
        self._session = session
        self._loop_thread = loop_thread

    @property
    def session(self) -> Session:
        return self._session

    @property
    def models(self) -> list[ModelCard]:
        return self._session.models

    @property
    def limits(self) -> Limits:
        return self._session.limits

    @property
    def session_id(self) -> str:
        return self._session.session_id

    @property
    def server_version(self) -> str:
        return self._session.server_version

    @property
    def url(self) -> str:
        return self._session.url

    @property
    def num_pending(self) -> int:
        return self._session.num_pending

    @property
    def num_frames_sent(self) -> int:
        return self._session.num_frames_sent

    @property
    def closed(self) -> bool:
        return self._session.closed

    # -- declaring: the same calls as Session (no I/O) --------------------------------

    def function(
        self,
        template: str,
        /,
        *,
        model: str | None = None,
        outputs: Mapping[str, SamplingLike] | None = None,
        **output_specs: SamplingLike,
    ) -> SemanticFunction:
        """See Session.function (pure)."""
        return self._session.function(template, model=model, outputs=outputs, **output_specs)

    def call(
        self,
        pieces: Sequence[Piece],
        *,
        model: str | None = None,
        add_special_tokens: bool = True,
    ) -> list[SemanticVariable]:
        """See Session.call (mutates the pending fragment)."""
        return self._session.call(pieces, model=model, add_special_tokens=add_special_tokens)

    def variable(self, value: str | None = None, name: str | None = None) -> SemanticVariable:
        """See Session.variable (mutates the pending fragment)."""
        return self._session.variable(value, name)

    def join(
        self,
        items: Iterable[str | SemanticVariable],
        sep: str = "",
        prefix: str = "",
        suffix: str = "",
    ) -> SemanticVariable:
        """See Session.join (mutates the pending fragment)."""
        return self._session.join(items, sep, prefix, suffix)

    def repr_list(self, items: Iterable[str | SemanticVariable]) -> SemanticVariable:
        """See Session.repr_list (mutates the pending fragment)."""
        return self._session.repr_list(items)

    def new_variable(self, name: str | None = None) -> SemanticVariable:
        """See Session.new_variable: a variable never declared, e.g. a map's element (mutates
        only the id counter)."""
        return self._session.new_variable(name)

    def map(
        self,
        items: SemanticVariable,
        element: SemanticVariable,
        pieces: Sequence[Piece] | MapSteps,
        *,
        items_path: Sequence[str] = (),
        model: str | None = None,
    ) -> SemanticVariable:
        """See Session.map (mutates the pending fragment)."""
        return self._session.map(items, element, pieces, items_path=items_path, model=model)

    def map_steps(self, element: SemanticVariable) -> MapSteps:
        """See Session.map_steps (pure)."""
        return self._session.map_steps(element)

    def map_pipeline(
        self,
        items: SemanticVariable,
        steps: MapSteps,
        *,
        items_path: Sequence[str] = (),
        step_outputs: bool = False,
    ) -> tuple[SemanticVariable, list[SemanticVariable]]:
        """See Session.map_pipeline (mutates the pending fragment)."""
        return self._session.map_pipeline(
            items, steps, items_path=items_path, step_outputs=step_outputs
        )

    def switch(
        self,
        on: SemanticVariable,
        cases: Mapping[str, Iterable[SemanticVariable]],
        path: Sequence[str] = (),
    ) -> str:
        """See Session.switch (mutates the pending fragment)."""
        return self._session.switch(on, cases, path)

    def retract(self, outputs: Iterable[SemanticVariable], switch_ids: Iterable[str] = ()) -> int:
        """See Session.retract (mutates the pending fragment)."""
        return self._session.retract(outputs, switch_ids)

    # -- asking: blocking ----------------------------------------------------------------

    def get_many(
        self,
        vars: Iterable[SemanticVariable],
        criteria: Criteria = "latency",
        *,
        deadline_ms: float | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Blocking: the texts of ``vars``, all gets in one frame."""
        return self._session.get_many(vars, criteria, deadline_ms=deadline_ms, timeout=timeout)

    def flush(self, *, timeout: float | None = None) -> None:
        """Blocking: ships what is pending and waits for the server's ack."""
        self._session.bridge.block(self._session.flush, timeout)

    def tokenize(
        self, text: str, *, model: str | None = None, timeout: float | None = None
    ) -> list[int]:
        """Blocking: the server's token ids of ``text``."""
        return self._session.bridge.block(
            lambda: self._session.tokenize(text, model=model), timeout
        )

    def count_tokens(
        self, text: str, *, model: str | None = None, timeout: float | None = None
    ) -> int:
        """Blocking: the server's token count of ``text``."""
        return self._session.bridge.block(
            lambda: self._session.count_tokens(text, model=model), timeout
        )

    def close(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        """Closes the session and stops its loop thread (idempotent)."""
        if not self._loop_thread.loop.is_closed():
            try:
                self._session.bridge.block(self._session.aclose, timeout)
            finally:
                self._loop_thread.stop()

    def __enter__(self) -> SyncSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def connect_sync(
    url: str,
    *,
    token: str | None = None,
    app: str | None = None,
    tenant: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = DEFAULT_RETRIES,
) -> SyncSession:
    """Blocking :func:`connect`: the session runs on a new background loop thread. Use as
    ``with connect_sync(url) as app:`` or call ``app.close()``. Same errors and retries as
    connect."""
    loop_thread = _LoopThread()
    opening = open_session(
        url, token=token, app=app, tenant=tenant, timeout=timeout, retries=retries
    )
    future = asyncio.run_coroutine_threadsafe(opening, loop_thread.loop)
    try:
        session = future.result()  # open_session bounds its own wait by ``timeout``
    except BaseException:
        loop_thread.stop()
        raise
    return SyncSession(session, loop_thread)
