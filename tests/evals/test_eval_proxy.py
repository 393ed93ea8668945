"""The delay proxy adds the round trip to each exchange and keeps bytes in order."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from eclectus.evals.proxy import DelayProxy, Traffic


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _exchange(port: int, payloads: list[bytes]) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.perf_counter()
        for payload in payloads:
            sock.sendall(payload)
        want, got = sum(len(p) for p in payloads), b""
        while len(got) < want:
            got += sock.recv(65536)
        return got, time.perf_counter() - started


def _timed_exchanges(port: int, words: list[bytes]) -> list[float]:
    """Seconds each request-response exchange took on one new connection."""
    times = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for word in words:
            started = time.perf_counter()
            assert _ask(sock, word) == word
            times.append(time.perf_counter() - started)
    return times


def test_proxy_adds_one_round_trip_per_exchange_and_one_per_handshake(echo_port: int) -> None:
    """Through a 200 ms proxy a new connection's first exchange takes two round trips more
    (the TCP handshake's, then the exchange's) and each later one a single round trip; a
    direct echo takes neither."""
    with DelayProxy("127.0.0.1", echo_port, rtt_s=0.2) as proxy:
        direct = _timed_exchanges(echo_port, [b"ping"])
        first, second = _timed_exchanges(proxy.port, [b"ping", b"pong"])
    assert direct[0] < 0.1
    assert 0.39 <= first < 0.8
    assert 0.19 <= second < 0.39


def test_proxy_without_handshake_charges_the_exchange_only(echo_port: int) -> None:
    """``handshake=False`` (the evals' ``--proxy-handshake off``): a new connection's first
    exchange costs one round trip, like every other."""
    with DelayProxy("127.0.0.1", echo_port, rtt_s=0.2, handshake=False) as proxy:
        (first,) = _timed_exchanges(proxy.port, [b"ping"])
    assert 0.19 <= first < 0.39


def test_proxy_keeps_order(echo_port: int) -> None:
    """Many chunks come back whole and in order."""
    payloads = [bytes([i]) * 1000 for i in range(50)]
    with DelayProxy("127.0.0.1", echo_port, rtt_s=0.02) as proxy:
        got, _ = _exchange(proxy.port, payloads)
    assert got == b"".join(payloads)


def test_proxy_rejects_negative_delay() -> None:
    with pytest.raises(ValueError):
        DelayProxy("127.0.0.1", 1, rtt_s=-1)


def _ask(sock: socket.socket, payload: bytes) -> bytes:
    """Send ``payload`` and wait for its echo (one request-response exchange)."""
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        got += sock.recv(65536)
    return got


def test_proxy_counts_a_turn_per_exchange_that_waited(echo_port: int) -> None:
    """Three exchanges that each wait for the echo are three turns; three sends pipelined
    before any answer came back are one; each connection counts once."""
    with DelayProxy("127.0.0.1", echo_port, rtt_s=0.1) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            for word in (b"one", b"two", b"three"):
                assert _ask(sock, word) == word
        waited = proxy.traffic()
        got, _ = _exchange(proxy.port, [b"a" * 10, b"b" * 10, b"c" * 10])
        assert got == b"a" * 10 + b"b" * 10 + b"c" * 10
        both = proxy.traffic()
    assert (waited.connections, waited.turns, waited.bytes_up) == (1, 3, 11)
    assert waited.bytes_down == 11 and waited.chunks_down >= 3
    assert 0 <= waited.client_s < 0.5  # the client answered at once each time
    pipelined = both - waited
    assert (pipelined.connections, pipelined.turns, pipelined.bytes_up) == (1, 1, 30)


def test_proxy_counts_nothing_before_traffic(echo_port: int) -> None:
    with DelayProxy("127.0.0.1", echo_port, rtt_s=0.0) as proxy:
        assert proxy.traffic() == Traffic()


def test_proxy_client_time_is_the_clients_pause_within_a_run(echo_port: int) -> None:
    """A pause between hearing the echo and sending again is client time; after new_run,
    the pause before the next send is not (it was spent between runs)."""
    with (
        DelayProxy("127.0.0.1", echo_port, rtt_s=0.02) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port)) as sock,
    ):
        _ask(sock, b"first")
        time.sleep(0.2)
        _ask(sock, b"second")
        paused = proxy.traffic()
        time.sleep(0.2)
        proxy.new_run()
        _ask(sock, b"third")
        fresh = proxy.traffic() - paused
    assert 0.2 <= paused.client_s < 2 and paused.turns == 2
    assert fresh.turns == 1 and fresh.client_s == 0.0
