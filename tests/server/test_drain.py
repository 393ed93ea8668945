"""SIGTERM on a real ``eclectus serve`` process: it stops accepting, lets in-flight work
finish within --shutdown-timeout, fails what is left with a clear error, and exits 0 without
a traceback."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from websockets.sync.client import connect

pytestmark = pytest.mark.slow


@contextmanager
def serving(*flags: str) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """``eclectus serve --port 0 FLAGS``; yields the process, its http:// URL and the lines
    of stderr read so far (a thread keeps reading them)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "eclectus", "serve", "--port", "0", "--model", "tiny", *flags],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    url = None
    for line in proc.stderr:
        lines.append(line)
        if match := re.search(r"on ws://(\S+)", line):
            url = f"http://{match.group(1)}"
            break
    assert url is not None, "".join(lines)
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        yield proc, url, lines
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        reader.join(timeout=5)


def complete(url: str, max_tokens: int, box: dict[str, object]) -> None:
    """POST one greedy completion; stores the status and JSON body in ``box``."""
    body = json.dumps({"prompt": "Once", "max_tokens": max_tokens, "ignore_eos": True})
    request = urllib.request.Request(
        f"{url}/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            box["status"], box["body"] = response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        box["status"], box["body"] = exc.code, json.loads(exc.read())


def in_flight(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        return "eclectus_inflight 1.0" in response.read().decode()


def start_request(url: str, max_tokens: int) -> tuple[threading.Thread, dict[str, object]]:
    box: dict[str, object] = {}
    thread = threading.Thread(target=complete, args=(url, max_tokens, box))
    thread.start()
    for _ in range(500):
        if in_flight(url):
            return thread, box
        time.sleep(0.01)
    raise AssertionError("the request never reached the engine")


def test_sigterm_lets_in_flight_work_finish() -> None:
    with serving("--shutdown-timeout", "60") as (proc, url, lines):
        thread, box = start_request(url, 120)
        proc.send_signal(signal.SIGTERM)
        thread.join(timeout=60)
        assert box["status"] == 200
        assert box["body"]["usage"]["completion_tokens"] == 120  # type: ignore[index]
        assert proc.wait(timeout=30) == 0
    assert not any("Traceback" in line or "CancelledError" in line for line in lines), lines


def test_sigterm_after_the_grace_period_fails_work_with_a_clear_error() -> None:
    """Past --shutdown-timeout, an HTTP request gets a 503 and a WebSocket get an error
    frame naming the shutdown, then the socket closes with 1001; the exit is still 0."""
    with serving("--shutdown-timeout", "0.5") as (proc, url, lines):
        with connect(url.replace("http://", "ws://")) as ws:
            ws.send(json.dumps({"type": "hello"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
            thread, box = start_request(url, 3000)
            call = {
                "id": "c",
                "template": "{{q}}{{a}}",
                "bind": {"q": "q", "a": "a"},
                "sampling": {"a": {"max_tokens": 3000, "ignore_eos": True}},
            }
            submit = {"type": "submit", "id": "s", "vars": [{"id": "q", "value": "Hi"}]}
            ws.send(json.dumps(submit | {"calls": [call], "gets": [{"var": "a"}]}))
            assert json.loads(ws.recv(timeout=10))["type"] == "ack"
            proc.send_signal(signal.SIGTERM)
            thread.join(timeout=30)
            assert box["status"] == 503
            assert "shutting down" in box["body"]["error"]["message"]  # type: ignore[index]
            frame = json.loads(ws.recv(timeout=30))
            assert frame["type"] == "error" and "shutting down" in frame["message"]
            with pytest.raises(Exception):  # noqa: B017 - the close, however websockets reports it
                ws.recv(timeout=30)
            assert ws.close_code == 1001
        assert proc.wait(timeout=30) == 0
    assert not any("Traceback" in line or "CancelledError" in line for line in lines), lines
