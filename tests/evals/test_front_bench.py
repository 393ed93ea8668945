"""The front bench's wrk load client: its script, its summary's parsing, and (where wrk is
installed; CI has none) one real run against a plain HTTP server."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eclectus.benchmarks.front import parse_wrk, request_body, run_client, wrk_script

_SUMMARY = """Running 5s test @ http://127.0.0.1:8000/v1/completions
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    20.12ms    3.01ms  40.00ms   70.00%
    Req/Sec     1.60k    80.00     1.80k    72.00%
  7981 requests in 5.01s, 3.10MB read
Requests/sec:   1593.01
Transfer/sec:    633.52KB
"""


def test_the_summary_gives_requests_and_the_measured_seconds() -> None:
    assert parse_wrk(_SUMMARY) == (7981, 5.01)
    assert parse_wrk(_SUMMARY.replace("in 5.01s", "in 900.00ms")) == (7981, 0.9)


@pytest.mark.parametrize(
    "failure",
    [
        "  Non-2xx or 3xx responses: 12\n",
        "  Socket errors: connect 0, read 3, write 0, timeout 0\n",
    ],
)
def test_a_failed_request_fails_the_run(failure: str) -> None:
    with pytest.raises(RuntimeError, match="failed requests"):
        parse_wrk(_SUMMARY + failure)


def test_output_without_a_summary_is_an_error_naming_it() -> None:
    with pytest.raises(RuntimeError, match="no summary"):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused")


def test_the_script_posts_the_body_as_json() -> None:
    body = request_body(16, stream=True)
    script = wrk_script(body)
    assert 'wrk.method = "POST"' in script
    assert 'wrk.headers["Content-Type"] = "application/json"' in script
    # the Lua string literal is the JSON text, quotes escaped
    literal = script.split("wrk.body = ", 1)[1].split("\n", 1)[0]
    assert json.loads(json.loads(literal)) == json.loads(body)


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_wrk_posts_the_body_to_completions_and_counts_the_answers() -> None:
    seen: list[tuple[str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            seen.append((self.path, self.rfile.read(length)))
            answer = b'{"choices": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = argparse.Namespace(load_client="wrk", concurrency=2, max_tokens=4, stream=False)
        num, elapsed, cpu = run_client(server.server_address[1], 1.0, args)
    finally:
        server.shutdown()
        server.server_close()
    assert num > 0 and num <= len(seen)
    assert 0.5 < elapsed < 5 and cpu >= 0
    assert {path for path, _ in seen} == {"/v1/completions"}
    assert json.loads(seen[0][1]) == json.loads(request_body(4, stream=False))


@pytest.mark.slow
def test_the_bench_alternates_fronts_with_their_flags_and_reports_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two fronts that differ in a flag, paced tokens, two short rounds: the fronts
    alternate, and each gets a summary line with its ratios to the first."""
    from eclectus.benchmarks.front import main

    fronts = ["--counts", "1", "--front-flags", "", "--front-flags", "--loop asyncio"]
    load = ["--seconds", "1", "--concurrency", "4", "--max-tokens", "4", "--stream"]
    main([*fronts, *load, "--rounds", "2", "--token-delay", "0.002", "--load-client", "python"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "load client: python, token delay 0.002 s"
    runs = [line for line in out if line.startswith("round ")]
    assert [line.split(":")[0] for line in runs] == [
        "round 0 N=1",
        "round 0 N=1 --loop asyncio",
        "round 1 N=1 --loop asyncio",
        "round 1 N=1",
    ]
    first, second = out[-2:]
    assert first.startswith("N=1: ") and "per round vs N x the first: 1.00, 1.00" in first
    assert re.match(
        r"N=1 --loop asyncio: [1-9]\d* req/s .* ms CPU/req .*; per round vs N x the first: "
        r"\d+\.\d\d, \d+\.\d\d; CPU/req per round vs the first: \d+\.\d\d, \d+\.\d\d$",
        second,
    )
