"""Everyday mistakes with the ``eclectus`` command, run as a user runs it (a subprocess): one
line naming the problem and what to do, a non-zero exit, no traceback unless ``--debug``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eclectus.cli import build_parser

pytestmark = pytest.mark.slow

ECLECTUS = [sys.executable, "-m", "eclectus"]
# eclectus as a terminal's foreground job gets it: SIGINT at its default. A job started in the
# background of a non-interactive shell (nohup ... &, as a CI runner may) inherits SIGINT
# ignored, and Python then installs no KeyboardInterrupt handler at all; exec keeps the pid.
WITH_DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'eclectus', *sys.argv[1:]])",
]


def eclectus(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ECLECTUS, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def error_line(done: subprocess.CompletedProcess[str], command: str) -> str:
    """The one error line ``eclectus COMMAND: ...`` of a failed run; fails the test on a
    traceback or on more than one such line."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith(f"eclectus {command}:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_port_in_use(busy_port: int) -> None:
    """`serve` on a taken port names the address and --port."""
    done = eclectus("serve", "--port", str(busy_port))
    line = error_line(done, "serve")
    assert f"127.0.0.1:{busy_port} is already in use" in line and "--port" in line
    assert done.returncode == 1


def test_debug_shows_the_traceback(busy_port: int) -> None:
    """--debug lets the exception through with its traceback."""
    done = eclectus("serve", "--port", str(busy_port), "--debug")
    assert done.returncode != 0 and "Traceback" in done.stderr
    assert "address already in use" in done.stderr.lower()


def test_python_m_server_takes_the_same_path(busy_port: int) -> None:
    """`python -m eclectus.server` explains the same mistake the same way."""
    cmd = [sys.executable, "-m", "eclectus.server", "--port", str(busy_port)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert "is already in use" in error_line(done, "serve") and done.returncode == 1


@pytest.mark.parametrize("command", ["serve", "run", "eval"])
def test_missing_model(command: str) -> None:
    """A --model that is neither a preset nor a directory: one line, exit 2."""
    argv = {"serve": ["serve"], "run": ["run", "map-reduce"], "eval": ["eval", "map-reduce"]}
    done = eclectus(*argv[command], "--model", "/nonexistent")
    line = error_line(done, command)
    assert "'/nonexistent' is neither a preset" in line and "directory" in line
    assert done.returncode == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA works here")
def test_serve_device_cuda_without_cuda() -> None:
    """--device cuda with a torch that has no CUDA says to use --device cpu."""
    done = eclectus("serve", "--port", "0", "--device", "cuda")
    assert "--device cpu" in error_line(done, "serve") and done.returncode == 1


def test_run_server_not_running(closed_port: int) -> None:
    """`run --server` at an address nobody serves names the URL and the flag."""
    url = f"ws://127.0.0.1:{closed_port}"
    done = eclectus("run", "map-reduce", "--server", url)
    line = error_line(done, "run")
    assert f"cannot reach {url} (--server)" in line and done.returncode == 1


def test_run_base_url_not_running(closed_port: int) -> None:
    """`run --backend openai --base-url` at nothing names the URL and the flag."""
    url = f"http://127.0.0.1:{closed_port}/v1"
    done = eclectus("run", "map-reduce", "--backend", "openai", "--base-url", url, "--quiet")
    line = error_line(done, "run")
    assert f"cannot reach {url} (--base-url)" in line and done.returncode == 1


def test_run_input_missing(tmp_path: Path) -> None:
    done = eclectus("run", "chain-summary", "--input", str(tmp_path / "notes.md"))
    line = error_line(done, "run")
    assert f"no such file or directory: {tmp_path / 'notes.md'}" in line
    assert done.returncode == 2


def test_eval_vllm_python_missing() -> None:
    done = eclectus("eval", "map-reduce", "--baseline", "vllm", "--vllm-python", "/nope/python")
    assert "--vllm-python /nope/python: no such file" in error_line(done, "eval")
    assert done.returncode == 2


def test_ctrl_c_in_run_stops_with_one_line() -> None:
    """Ctrl-C (SIGINT) while a recipe runs: the embedded server stops, one line, exit 130."""
    # chain-summary: 80 calls one after another (~16 s here), and progress every 2 s, so the
    # signal lands mid-run however fast the machine; a map-reduce's parallel maps all answer
    # in one step, and under load its first progress line came with the run nearly done.
    long_run = ["--chunk-tokens", "64", "--num-chunks", "80", "--output-tokens", "128"]
    proc = subprocess.Popen(
        [*WITH_DEFAULT_SIGINT, "run", "chain-summary", *long_run],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # the run is under way once the first call has answered
        if "calls" in line:
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
    assert error_line(done, "run") == "eclectus run: interrupted"
    assert proc.returncode == 130


def test_run_backend_openai_exits_quietly() -> None:
    """A successful openai-mode run prints its report and no traceback at shutdown."""
    done = eclectus(
        "run", "map-reduce", "--backend", "openai", "--num-chunks", "2", "--output-tokens", "4"
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "CancelledError" not in done.stderr
    assert "backend: openai" in done.stdout


def test_help_is_for_users() -> None:
    """`eclectus --help` describes the tool and its first commands; `serve --help` gives
    every flag a line of help and shows the defaults."""
    top = eclectus("--help").stdout
    assert "routes" not in top and "eclectus demo" in top and "eclectus serve" in top
    serve = eclectus("serve", "--help").stdout
    assert "--port PORT" in serve and "(default: 8765)" in serve
    assert "--max-sessions MAX_SESSIONS" in serve and "(default: 256)" in serve
    for command in ("serve", "run", "eval", "demo"):  # every flag says what it is for
        parser = build_parser([command])._subparsers._group_actions[0].choices[command]
        missing = [a.dest for a in parser._actions if a.option_strings and not a.help]
        assert not missing, (command, missing)
