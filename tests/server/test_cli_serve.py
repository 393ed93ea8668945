"""``python -m eclectus serve`` as a user runs it: listens, answers HTTP, checks the token,
sizes its engine as the budget flags say, refuses bad flags by name, and exits cleanly on
SIGTERM."""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from websockets.sync.client import connect

from eclectus.adapters.client import connect_sync
from eclectus.cli import main
from eclectus.protocol.kv_events import KVEventsConfig
from eclectus.server.config import ServerConfig
from eclectus.server.engine.engine_config import EngineConfig, GiB
from eclectus.server.engine_flags import engine_config_from_args
from eclectus.server.flags import add_arguments, config_from_args

pytestmark = pytest.mark.slow


@contextmanager
def serving(*flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``eclectus serve --port 0 FLAGS`` in its own process; yields its ws:// URL, then sends
    SIGTERM and checks that it exits 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "eclectus", "serve", "--port", "0", *flags],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
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
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_serve_subcommand_end_to_end() -> None:
    env_token = {"ECLECTUS_TOKEN": "from-env", "PATH": "/usr/bin:/bin"}
    with serving("--model", "tiny", env=env_token) as url:
        health = urllib.request.urlopen(url.replace("ws://", "http://") + "/healthz", timeout=5)
        assert json.loads(health.read())["model"] == "tiny"
        with connect(url) as ws:
            ws.send(json.dumps({"type": "hello", "token": "wrong"}))
            assert json.loads(ws.recv(timeout=5))["code"] == "unauthorized"
        with connect(url) as ws:
            ws.send(json.dumps({"type": "hello", "token": "from-env"}))
            assert json.loads(ws.recv(timeout=5))["type"] == "welcome"


def test_engine_budget_flags_size_the_running_engine() -> None:
    """The budget flags reach the engine the process serves: /metrics shows the KV pool
    --num-kv-blocks asked for, and a request runs under the small step budgets."""
    flags = ("--num-kv-blocks", "48", "--block-size", "8", "--max-num-seqs", "2")
    with serving(*flags, "--max-num-batched-tokens", "64", "--num-threads", "1") as url:
        metrics = urllib.request.urlopen(url.replace("ws://", "http://") + "/metrics", timeout=5)
        assert "eclectus_engine_total_blocks 48" in metrics.read().decode()
        with connect_sync(url) as app:  # a 200-token prompt: prefilled in 64-token chunks
            answer = app.function("{{doc}}{{out}}", out=dict(max_tokens=8, ignore_eos=True))
            out = answer(doc="budget " * 28)
            assert isinstance(out.get(timeout=60), str) and out.finish_reason == "length"


def test_a_model_that_cannot_load_exits_2_with_the_reason() -> None:
    """No traceback for a missing checkpoint: one line naming it, exit status 2."""
    done = subprocess.run(
        [sys.executable, "-m", "eclectus", "serve", "--port", "0", "--model", "/no/such/dir"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("eclectus serve: model '/no/such/dir' is neither a preset")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--block-size", "0"], "argument --block-size: must be an integer >= 1, got '0'"),
        (["--max-num-seqs", "1.5"], "argument --max-num-seqs: must be an integer >= 1, got '1.5'"),
        (["--kv-cache-gib", "-1"], "argument --kv-cache-gib: must be a number of GiB > 0"),
        (["--kv-cache-gib", "inf"], "argument --kv-cache-gib: must be a number of GiB > 0"),
        (["--seed", "-3"], "argument --seed: must be an integer >= 0, got '-3'"),
        (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
        (["--tool-call-parser", "pythonic"], "argument --tool-call-parser: invalid choice"),
        (
            ["--engine-stream-interval", "0"],
            "argument --engine-stream-interval: must be an integer >= 1, got '0'",
        ),
        (["--engine-timeout", "0"], "argument --engine-timeout: must be a number > 0, got '0'"),
        (
            ["--las-tokens-per-s", "nan"],
            "argument --las-tokens-per-s: must be a number > 0, got 'nan'",
        ),
        (
            ["--handshake-timeout", "nan"],
            "argument --handshake-timeout: must be a number > 0, got 'nan'",
        ),
        (["--idle-timeout", "inf"], "argument --idle-timeout: must be a number > 0, got 'inf'"),
        (["--idle-timeout", "0"], "argument --idle-timeout: must be a number > 0, got '0'"),
        (
            ["--shutdown-timeout", "-1"],
            "argument --shutdown-timeout: must be a number >= 0, got '-1'",
        ),
        (
            ["--shutdown-timeout", "nan"],
            "argument --shutdown-timeout: must be a number >= 0, got 'nan'",
        ),
        (["--aging-rate", "nan"], "argument --aging-rate: must be a number >= 0, got 'nan'"),
        (
            ["--engine-down-wait", "-1"],
            "argument --engine-down-wait: must be a number >= 0, got '-1'",
        ),
        (
            ["--engine-down-wait", "inf"],
            "argument --engine-down-wait: must be a number >= 0, got 'inf'",
        ),
    ],
)
def test_bad_engine_flags_are_refused_by_name(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad budget stops `eclectus serve` before it loads anything, naming the flag."""
    with pytest.raises(SystemExit) as stopped:
        main(["serve", *flags])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_every_engine_flag_reaches_the_engine_config() -> None:
    """Every EngineConfig field has a flag (``kv_cache_bytes`` as --kv-cache-gib), and a
    non-default value for each lands in engine_config_from_args's EngineConfig."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {
        "model": "other",
        "dtype": "bfloat16",
        "device": "meta",
        "block_size": 32,
        "num_kv_blocks": 10,
        "max_num_batched_tokens": 512,
        "max_num_seqs": 4,
        "max_background_seqs": 2,
        "max_model_len": 1024,
        "num_threads": 3,
        "seed": 7,
    }
    argv = [str(part) for k, v in flags.items() for part in (f"--{k.replace('_', '-')}", v)]
    switches = [
        "--no-enable-prefix-caching",
        "--no-cascade-attention",
        "--jump-forward",
        "--budget-guarantee",
        "--compact-json",
    ]
    events = ["--kv-events-config", '{"endpoint": "tcp://*:6000"}']
    config = engine_config_from_args(
        parser.parse_args([*argv, *switches, *events, "--kv-cache-gib", "2"])
    )
    expected = flags | {
        "kv_events": KVEventsConfig(endpoint="tcp://*:6000"),
        "enable_prefix_caching": False,
        "cascade_attention": False,
        "jump_forward": True,
        "budget_guarantee": True,
        "json_whitespace": "compact",
        "kv_cache_bytes": 2 * GiB,
    }
    assert {f.name for f in dataclasses.fields(EngineConfig)} == set(expected)
    assert {k: getattr(config, k) for k in expected} == expected
    assert engine_config_from_args(parser.parse_args([])) == EngineConfig()
    unlimited = parser.parse_args(["--max-background-seqs", "none"])
    assert engine_config_from_args(unlimited).max_background_seqs is None


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
        "max_sessions_per_tenant": 5,
        "max_connections_per_client": 6,
        "max_prompts_per_request": 4,
        "max_pending_gets_per_session": 5,
        "max_outbox_bytes": 4096,
        "max_map_items": 8,
        "max_map_element_bytes": 99,
        "tool_call_parser": "mistral",
        "engine_stream_interval": 4,
    }
    argv = [str(part) for k, v in flags.items() for part in (f"--{k.replace('_', '-')}", v)]
    config = config_from_args(parser.parse_args([*argv, "--token", "t"]))
    assert {k: getattr(config, k) for k in flags} == flags
    assert config.token == "t"
    assert config.close_timeout_s == ServerConfig().close_timeout_s
    monkeypatch.setenv("ECLECTUS_TOKEN", "from-env")
    assert config_from_args(parser.parse_args(argv)).token == "from-env"
    timeouts = ["--handshake-timeout", "1.5", "--idle-timeout", "2.5", "--shutdown-timeout", "3"]
    config = config_from_args(parser.parse_args(timeouts))
    assert (config.handshake_timeout_s, config.idle_timeout_s) == (1.5, 2.5)
    assert config.shutdown_timeout_s == 3.0


def test_token_file_flag_names_tenants(tmp_path: pathlib.Path) -> None:
    """--token-file gives one tenant per line, beside --token's tenant 'default'."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    path = tmp_path / "tokens"
    path.write_text("alice ta\nbob tb\n")
    config = config_from_args(parser.parse_args(["--token-file", str(path), "--token", "t"]))
    assert config.credentials == (("default", "t"), ("alice", "ta"), ("bob", "tb"))


def test_served_model_names_flag() -> None:
    """--served-model-name takes one or more names, as vLLM's does; none: the model's own."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    given = parser.parse_args(["--served-model-name", "a", "b"])
    assert config_from_args(given).served_model_names == ("a", "b")
    assert config_from_args(parser.parse_args([])).served_model_names == ()


def test_a_tool_call_parser_of_no_known_format_is_refused_in_the_config() -> None:
    with pytest.raises(ValueError, match="hermes, llama3_json, mistral"):
        ServerConfig(tool_call_parser="pythonic")  # type: ignore[arg-type]
    assert ServerConfig().tool_call_parser is None  # detected from the chat template


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("handshake_timeout_s", float("nan"), "handshake_timeout_s must be > 0 and finite"),
        ("idle_timeout_s", float("inf"), "idle_timeout_s must be > 0 and finite"),
        ("shutdown_timeout_s", float("nan"), "shutdown_timeout_s must be >= 0 and finite"),
        ("shutdown_timeout_s", -1.0, "shutdown_timeout_s must be >= 0 and finite"),
        ("aging_rate", float("nan"), "aging_rate must be >= 0 and finite"),
        ("kv_admit_fraction", float("nan"), r"kv_admit_fraction must be in \(0, 1\]"),
    ],
)
def test_a_number_that_is_no_number_is_refused_in_the_config(
    field: str, value: float, message: str
) -> None:
    """The config refuses what the flags refuse: NaN and infinity are no timeout or rate."""
    with pytest.raises(ValueError, match=message):
        ServerConfig(**{field: value})  # type: ignore[arg-type]
    assert ServerConfig(shutdown_timeout_s=0.0).shutdown_timeout_s == 0.0  # none: stop now
