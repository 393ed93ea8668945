"""The shared client layer's session policy, against the recording peer: one session per
(URL, token, app), opened once however many threads ask, reopened after the server closed
it; URLs and environment defaults."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from client_peer import FakePeer

from eclectus.adapters.client import DEFAULT_URL
from eclectus.adapters.connection import connection_for, default_token, default_url, ws_url


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
