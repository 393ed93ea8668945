"""The shared client layer's session policy, against the recording peer: one session per
(URL, token, app), opened once however many threads ask, reopened after the server closed
it, freed once closed and held by nothing; URLs and environment defaults."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from client_peer import FakePeer

from eclectus.adapters.client import DEFAULT_URL
from eclectus.adapters.connection import (
    connection_for,
    default_token,
    default_url,
    open_connections,
    ws_url,
)


def test_ws_url_conversions() -> None:
    assert ws_url("http://h:1/v1") == "ws://h:1"
    assert ws_url("https://h/v1/") == "wss://h"
    assert ws_url("ws://h:2/") == "ws://h:2"


def test_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ECLECTUS_URL", raising=False)
    monkeypatch.setenv("ECLECTUS_TOKEN", "")
    assert default_url() == DEFAULT_URL and default_token() is None
    monkeypatch.setenv("ECLECTUS_URL", "ws://elsewhere:9")
    monkeypatch.setenv("ECLECTUS_TOKEN", "t")
    assert default_url() == "ws://elsewhere:9" and default_token() == "t"


def test_one_connection_per_settings(peer: FakePeer) -> None:
    """The same (URL, token, app) is one Connection, whatever the URL's spelling."""
    http = peer.url.replace("ws://", "http://") + "/v1"
    assert connection_for(peer.url, None, "a") is connection_for(http, None, "a")
    assert connection_for(peer.url, None, "a") is not connection_for(peer.url, None, "b")


def test_concurrent_first_use_opens_one_session(peer: FakePeer) -> None:
    """Eight threads asking at once get one session: one hello reaches the server."""
    connection = connection_for(peer.url, None, "threads")
    with ThreadPoolExecutor(8) as pool:
        sessions = list(pool.map(lambda _: connection.session, range(8)))
    assert len({id(s) for s in sessions}) == 1
    assert len(peer.of_type("hello")) == 1
    connection.close()


def test_a_session_the_server_closed_is_reopened(peer: FakePeer) -> None:
    """After the server dropped the connection, the next use opens a fresh session."""
    connection = connection_for(peer.url, None, "reopen")
    first = connection.session
    peer.drop_connections()
    deadline = time.monotonic() + 5
    while not first.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    second = connection.session
    assert first.closed and second is not first and not second.closed
    assert len(peer.of_type("hello")) == 2
    connection.close()
    assert second.closed


def _live_apps() -> set[str | None]:
    gc.collect()
    return {connection.app for connection in open_connections()}


def _eventually(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_a_closed_connection_is_freed_and_its_thread_stops(peer: FakePeer) -> None:
    """Closed and held by nothing, a Connection leaves the registry and its loop thread
    ends."""
    before = set(threading.enumerate())
    connection = connection_for(peer.url, None, "closed-app")
    assert not connection.session.closed
    (thread,) = [t for t in set(threading.enumerate()) - before if t.name == "eclectus-connection"]
    connection.close()
    del connection
    assert _eventually(lambda: "closed-app" not in _live_apps())
    assert _eventually(lambda: not thread.is_alive())


def test_apps_by_many_names_leave_nothing_behind(peer: FakePeer) -> None:
    """A process opening and closing apps by many names, or only naming them, keeps none."""

    def open_and_close(app: str) -> None:
        connection = connection_for(peer.url, None, app)
        assert not connection.session.closed
        connection.close()

    for number in range(5):
        connection_for(peer.url, None, f"named-{number}")
        connection_for(peer.url, None, f"opened-{number}").session.close()
        open_and_close(f"closed-{number}")
    assert _eventually(lambda: not {app for app in _live_apps() if app and app[:-1].endswith("-")})


def test_an_open_session_stays_shared_while_nobody_holds_it(peer: FakePeer) -> None:
    """Between calls no model may hold its Connection (LangChain builds one per call): while
    its session is open, the next caller still gets that session, and no second hello."""
    first = connection_for(peer.url, None, "kept").session
    assert "kept" in _live_apps()
    again = connection_for(peer.url, None, "kept")
    assert again.session is first and len(peer.of_type("hello")) == 1
    again.close()


def test_a_closed_connection_still_held_is_the_one_shared(peer: FakePeer) -> None:
    """A model holding a closed Connection and a new model with its settings share it: one
    reopened session between them."""
    held = connection_for(peer.url, None, "held")
    first = held.session
    held.close()
    gc.collect()
    assert connection_for(peer.url, None, "held") is held
    second = connection_for(peer.url, None, "held").session
    assert held.session is second and second is not first and first.closed
    assert len(peer.of_type("hello")) == 2
    held.close()
