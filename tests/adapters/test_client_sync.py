"""The blocking twin and cross-loop use against the recording peer."""

from __future__ import annotations

import asyncio
import threading

import pytest
from client_peer import FakePeer

from eclectus.adapters.client import (
    AuthError,
    Gen,
    SemanticVariable,
    VariableFailed,
    connect,
    connect_sync,
)


def test_get_and_stream_block(peer: FakePeer) -> None:
    """connect_sync: get() and stream() block; one submit carries the whole fragment."""
    with connect_sync(peer.url) as app:
        summarize = app.function("S:{{doc}}->{{summary}}", summary=dict(max_tokens=8))
        parts = [summarize(doc=d) for d in ("a", "b", "c")]
        joined = app.join([p for p in parts if isinstance(p, SemanticVariable)], sep="|")
        peer.texts[joined.id] = "x|y|z"
        assert app.num_pending == 8  # 3 outputs + 3 calls, the join output + its op
        assert joined.get(timeout=5) == "x|y|z"
        assert len(peer.of_type("submit")) == 1 and app.num_frames_sent == 1
        assert app.num_pending == 0 and app.url == peer.url and app.server_version == "peer"
        (streamed,) = app.call(["go", Gen(max_tokens=4)])
        peer.texts[streamed.id] = "streaming text"
        assert "".join(streamed.stream(timeout=5)) == "streaming text"
        assert app.count_tokens("a b") == 2
    assert app.closed


def test_set_from_a_thread_and_get_many(peer: FakePeer) -> None:
    """set() and get_many() from plain threads."""
    with connect_sync(peer.url) as app:
        slot = app.variable(name="slot")
        slot.set("filled", timeout=5)
        (out,) = app.call([slot, Gen()])
        assert app.get_many([slot, out], timeout=5) == ["filled", f"text of {out.id}"]
        assert peer.of_type("set")[0]["value"] == "filled"


def test_failure_surfaces_in_the_blocking_call(peer: FakePeer) -> None:
    """A failed variable raises VariableFailed from get()."""
    with connect_sync(peer.url) as app:
        (out,) = app.call(["x", Gen()])
        peer.fail_vars[out.id] = "engine_error"
        with pytest.raises(VariableFailed, match="engine_error"):
            out.get(timeout=5)


def test_aget_from_another_event_loop(peer: FakePeer) -> None:
    """A connect_sync session's variables can be awaited from an unrelated loop."""
    with connect_sync(peer.url) as app:
        (out,) = app.call(["x", Gen()])

        async def elsewhere() -> tuple[str, list[str]]:
            (streamed,) = app.call(["y", Gen()])
            return await out.aget(), [d async for d in streamed.astream()]

        text, deltas = asyncio.run(elsewhere())
        assert text == f"text of {out.id}"
        assert "".join(deltas).startswith("text of v")


def test_declaring_from_many_threads_then_one_get(peer: FakePeer) -> None:
    """Threads declare concurrently; one get ships everything in a single submit."""
    with connect_sync(peer.url) as app:
        f = app.function("{{x}}{{y}}", y={})
        outs: list[SemanticVariable] = []
        lock = threading.Lock()

        def declare() -> None:
            mine = [f(x="q") for _ in range(20)]
            with lock:
                outs.extend(v for v in mine if isinstance(v, SemanticVariable))

        threads = [threading.Thread(target=declare) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        texts = app.get_many(outs, timeout=5)
        assert texts == [f"text of {v.id}" for v in outs]
        (submit,) = peer.of_type("submit")
        assert len(submit["calls"]) == 60 and len(submit["gets"]) == 60


async def test_blocking_get_on_the_session_loop_is_refused(peer: FakePeer) -> None:
    """get() on the loop that runs the session would deadlock: RuntimeError instead."""
    async with connect(peer.url) as app:
        (out,) = app.call(["x", Gen()])
        with pytest.raises(RuntimeError, match="deadlock"):
            out.get()
        assert await asyncio.to_thread(out.get, timeout=5) == f"text of {out.id}"


def test_connect_sync_auth_error() -> None:
    """connect_sync raises AuthError for a wrong token and leaves no loop thread behind."""
    guarded = FakePeer(token="t")
    before = threading.active_count()
    with guarded.running(), pytest.raises(AuthError):
        connect_sync(guarded.url, token="nope")
    assert threading.active_count() <= before


def test_breaking_out_of_a_stream_early_leaves_the_session_usable(peer: FakePeer) -> None:
    """Abandoning stream()/astream() after one delta closes it cleanly on the session loop:
    an abandoned variable fails with ``cancelled`` (test_client_abandon.py), the rest of
    the session works on."""
    with connect_sync(peer.url) as app:
        peer.hold_values = True  # each generation outlives its stream
        (out,) = app.call(["x", Gen()])
        peer.texts[out.id] = "abcdefghijkl"
        for first in out.stream(timeout=5):
            assert first == "abc"
            break

        async def first_async_delta() -> str:
            (other,) = app.call(["y", Gen()])
            async for delta in other.astream():
                return delta
            raise AssertionError("no delta")

        assert asyncio.run(first_async_delta()).startswith("tex")
        with pytest.raises(VariableFailed, match="cancelled"):
            out.get(timeout=5)
        peer.hold_values = False
        (fresh,) = app.call(["z", Gen()])
        assert app.get_many([fresh], timeout=5) == [f"text of {fresh.id}"]
