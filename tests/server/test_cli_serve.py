"""``python -m eclectus serve`` as a user runs it: listens, answers HTTP, checks the token,
and exits cleanly on SIGTERM."""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
from websockets.sync.client import connect

from eclectus.server.config import ServerConfig
from eclectus.server.main import add_arguments, config_from_args

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


def test_every_serve_flag_reaches_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """config_from_args copies each flag by name: a non-default value for every flag lands
    in its ServerConfig field; --token falls back to ECLECTUS_TOKEN."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {
        "host": "0.0.0.0",
        "port": 0,
        "model": "other",
        "max_frame_bytes": 100,
        "max_prompt_tokens": 11,
        "max_vars_per_session": 12,
        "max_calls_per_session": 13,
        "max_sessions": 7,
        "max_inflight": 3,
        "max_background_inflight": 2,
        "aging_rate": 0.5,
        "openai_port": 9,
    }
    argv = [str(part) for k, v in flags.items() for part in (f"--{k.replace('_', '-')}", v)]
    config = config_from_args(parser.parse_args([*argv, "--token", "t"]))
    assert {k: getattr(config, k) for k in flags} == flags
    assert config.token == "t"
    assert config.close_timeout_s == ServerConfig().close_timeout_s
    monkeypatch.setenv("ECLECTUS_TOKEN", "from-env")
    assert config_from_args(parser.parse_args(argv)).token == "from-env"
