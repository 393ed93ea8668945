"""``python -m eclectus serve`` as a user runs it: listens, answers HTTP, checks the token,
and exits cleanly on SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
from websockets.sync.client import connect

pytestmark = pytest.mark.slow


def test_serve_subcommand_end_to_end() -> None:
    env_token = {"ECLECTUS_TOKEN": "from-env", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "eclectus", "serve", "--port", "0", "--model", "tiny"],
        stderr=subprocess.PIPE,
        text=True,
        env=env_token,
    )
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:
            match = re.search(r"on (ws://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url is not None, "server never reported its url"
        health = urllib.request.urlopen(url.replace("ws://", "http://") + "/healthz", timeout=5)
        assert json.loads(health.read())["model"] == "tiny"
        with connect(url) as ws:
            ws.send(json.dumps({"type": "hello", "token": "wrong"}))
            assert json.loads(ws.recv(timeout=5))["code"] == "unauthorized"
        with connect(url) as ws:
            ws.send(json.dumps({"type": "hello", "token": "from-env"}))
            assert json.loads(ws.recv(timeout=5))["type"] == "welcome"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
