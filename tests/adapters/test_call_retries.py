"""The retry policy every adapter path shares (eclectus.adapters.calls.Caller): after a lost
connection a call is declared again on a fresh session, up to max_retries more times; a
stream is retried only while it has yielded nothing. The connection and the variables are
stand-ins here (the real ones are exercised in test_adapter_options.py); the sync paths go
through the real bridge (a real loop thread), as every adapter's sync entry point does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eclectus.adapters.calls import Caller, CallOptions
from eclectus.adapters.client.bridge import LoopBridge, LoopThread
from eclectus.adapters.client.errors import ConnectionError as ClientConnectionError


class Sessions:
    """A connection stand-in: a new session object per connect; counts forgets. Its bridge
    is a real loop thread's."""

    def __init__(self, loop_thread: LoopThread) -> None:
        self.opened: list[object] = []
        self.forgotten: list[object] = []
        self._current: object | None = None
        self.bridge: LoopBridge = loop_thread.bridge

    async def asession(self) -> object:
        if self._current is None:
            self._current = object()
            self.opened.append(self._current)
        return self._current

    def forget(self, session: object) -> None:
        self.forgotten.append(session)
        if self._current is session:
            self._current = None


class Var:
    """A variable stand-in whose stream yields ``deltas`` then, if ``lost``, loses the
    connection."""

    def __init__(self, deltas: list[str], lost: bool) -> None:
        self.deltas, self.lost = deltas, lost

    async def astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[str]:
        for delta in self.deltas:
            yield delta
        if self.lost:
            raise ClientConnectionError("lost")


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread(name="test-retries")
    yield thread
    thread.stop()


def caller(loop_thread: LoopThread, max_retries: int) -> tuple[Caller, Sessions]:
    sessions = Sessions(loop_thread)
    return Caller(sessions, CallOptions(max_retries=max_retries)), sessions  # type: ignore[arg-type]


def failing(num_failures: int) -> Any:
    """An attempt that loses the connection on its first ``num_failures`` tries."""
    tries: list[object] = []

    def attempt(session: object) -> int:
        tries.append(session)
        if len(tries) <= num_failures:
            raise ClientConnectionError("lost")
        return len(tries)

    return attempt


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # the thread is shared
@given(st.integers(0, 3), st.integers(0, 5), st.booleans())
def test_calls_retry_up_to_max_retries_on_fresh_sessions(
    loop_thread: LoopThread, max_retries: int, num_failures: int, use_async: bool
) -> None:
    """Sync and async: success on try n+1 after n losses when n <= max_retries, each try on
    a session of its own; else the loss is raised after 1 + max_retries tries."""
    model, sessions = caller(loop_thread, max_retries)
    attempt = failing(num_failures)

    async def aattempt(session: object) -> int:
        return attempt(session)

    def run() -> int:
        if use_async:
            return asyncio.run(model.aretrying(aattempt))
        return model.block(lambda: model.aretrying(aattempt))

    if num_failures <= max_retries:
        assert run() == num_failures + 1
        assert len(sessions.opened) == num_failures + 1
    else:
        with pytest.raises(ClientConnectionError):
            run()
        assert len(sessions.opened) == max_retries + 1
    assert sessions.forgotten == sessions.opened[: len(sessions.forgotten)]


def drain(model: Caller, declare: Any, use_async: bool) -> list[Any]:
    if not use_async:
        return list(model.iterate(model.astream(declare)))

    async def adrain() -> list[Any]:
        return [item async for item in model.astream(declare)]

    return asyncio.run(adrain())


@pytest.mark.parametrize("use_async", [False, True])
def test_a_stream_lost_before_its_first_delta_is_retried(
    loop_thread: LoopThread, use_async: bool
) -> None:
    model, sessions = caller(loop_thread, max_retries=1)
    vars_ = iter([Var([], lost=True), Var(["a", "b"], lost=False)])
    items = drain(model, lambda session: next(vars_), use_async)
    assert items[:2] == ["a", "b"] and isinstance(items[2], Var)
    assert len(sessions.opened) == 2 and len(sessions.forgotten) == 1


@pytest.mark.parametrize("use_async", [False, True])
def test_a_stream_lost_after_a_delta_is_raised(loop_thread: LoopThread, use_async: bool) -> None:
    """The caller has seen part of the text: no retry, even with retries left."""
    model, sessions = caller(loop_thread, max_retries=3)
    with pytest.raises(ClientConnectionError):
        drain(model, lambda session: Var(["a"], lost=True), use_async)
    assert len(sessions.opened) == 1 and sessions.forgotten == sessions.opened
