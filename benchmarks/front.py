"""The front's own ceiling: ``python -m eclectus.benchmarks.front``.

An engine that answers at once (instant_engine.py) behind ``eclectus serve --engine-url``, so
every CPU cycle a request costs is the front's (plus the instant engine's small HTTP and the
load client's). For each front size N in ``--counts`` (``--api-server-count N``; N = 1 is the
plain single process), and for each set of ``--front-flags`` (repeat it to compare fronts
with other flags, such as ``--loop asyncio``), alternating over ``--rounds``: start the
front, warm it up, let a
load client in its own process keep ``--concurrency`` keep-alive connections busy with
``/v1/completions`` requests (``--max-tokens`` tokens each, ``--stream`` for SSE) for
``--seconds`` (the fronts' order reversed every other round), and count the requests
completed and the CPU the front's processes spent. ``--token-delay S`` has the engine space
its streamed tokens as a real engine's steps do: then every token crosses the front in its
own loop iteration, and the CPU per request, not the requests/s, is what to read.
The load client is wrk (``--load-client wrk``; the default where ``wrk`` is on PATH: ``apt
install wrk``), one thread, or else a raw-socket asyncio client in Python (``python``). The
client shares the cores with the fronts, and what it spends a request caps the scaling the
bench can show (docs/benchmarks.md): wrk spends a fraction of the Python client's.
Prints one line per run, then per front the median requests/s with its spread, CPU per
request, and the ratio to N x the first front's requests/s measured in the same round (for N =
2 against N = 1, the scaling; target >= 0.8 x 2 x one's) and of the CPU per request to the
first's. The machine's load average is printed with every run: on a shared machine, read
the spread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eclectus.evals.cpus import children

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_line(proc: subprocess.Popen[str], pattern: str, timeout_s: float = 120) -> str:
    """The first stderr line matching ``pattern`` (blocking)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    for line in proc.stderr:
        match = re.search(pattern, line)
        if match:
            return match.group(1)
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"no line matching {pattern!r}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads (reads /proc); 0 when
    it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (after comm)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its children (reads /proc)."""
    return cpu_seconds(pid) + sum(map(cpu_seconds, children(pid)))


# -- the load client (its own process) ------------------------------------------------------


async def _one_connection(port: int, body: bytes, stream: bool, stop_at: float) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    done = 0
    while time.monotonic() < stop_at:
        writer.write(head + body)
        response = await reader.readuntil(b"\r\n\r\n")
        assert response.startswith(b"HTTP/1.1 200"), response[:200]
        if stream:
            await reader.readuntil(b"\r\n0\r\n\r\n")  # the chunked body's end
        else:
            length = int(re.search(rb"content-length: (\d+)", response, re.I).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
        done += 1
    writer.close()
    return done


def request_body(tokens: int, stream: bool) -> bytes:
    """The one request every client sends (pure)."""
    return json.dumps(
        {"model": "tiny", "prompt": "Hello there", "max_tokens": tokens, "stream": stream}
    ).encode()


async def _client(port: int, seconds: float, concurrency: int, tokens: int, stream: bool) -> int:
    body = request_body(tokens, stream)
    stop_at = time.monotonic() + seconds
    counts = await asyncio.gather(
        *(_one_connection(port, body, stream, stop_at) for _ in range(concurrency))
    )
    return sum(counts)


def wrk_script(body: bytes) -> str:
    """wrk's Lua script that POSTs ``body`` as JSON on every request (pure)."""
    return (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )


def parse_wrk(output: str) -> tuple[int, float]:
    """Requests completed and the seconds wrk measured, from its summary (pure);
    RuntimeError when any response was not a 2xx or any socket failed, as the Python client's
    assert on every status line."""
    match = re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)\b", output)
    if match is None:
        raise RuntimeError(f"no summary in wrk's output: {output[-500:]!r}")
    if "Non-2xx" in output or "Socket errors" in output:
        raise RuntimeError(f"wrk saw failed requests: {output[-500:]!r}")
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0}[match.group(3)]
    return int(match.group(1)), float(match.group(2)) * scale


def run_client(port: int, seconds: float, args: argparse.Namespace) -> tuple[int, float, float]:
    """One load run against the front on ``port``: requests completed, the seconds they
    took, and the client's CPU seconds (blocking)."""
    if args.load_client == "wrk":
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
            script.write(wrk_script(request_body(args.max_tokens, args.stream)))
            script.flush()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            command = ["wrk", "-t1", f"-c{args.concurrency}", f"-d{max(round(seconds), 1)}s"]
            command += ["-s", script.name, f"http://127.0.0.1:{port}/v1/completions"]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        num, elapsed = parse_wrk(done.stdout)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return num, elapsed, cpu
    client = [sys.executable, "-m", "eclectus.benchmarks.front", "--client", str(port)]
    client += ["--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens)]
    client += ["--stream"] if args.stream else []
    done = subprocess.run(
        [*client, "--seconds", str(seconds)], check=True, capture_output=True, text=True
    )
    num_text, cpu_text = done.stdout.split()
    return int(num_text), seconds, float(cpu_text)


# -- one run ----------------------------------------------------------------------------------


Front = tuple[int, tuple[str, ...]]  # processes (--api-server-count), more serve flags


def front_label(front: Front) -> str:
    """How a front is named in the output (pure)."""
    count, flags = front
    return " ".join([f"N={count}", *flags])


def run_once(
    engine: subprocess.Popen[str], engine_url: str, front_spec: Front, args: argparse.Namespace
) -> dict[str, float]:
    """One front of ``count`` processes (and its flags) under load: requests/s, and CPU per
    request of the front, the instant engine and the load client."""
    count, flags = front_spec
    port = free_port()
    command = [sys.executable, "-m", "eclectus.server", "--model", "tiny", "--port", str(port)]
    command += ["--engine-url", engine_url, "--log-level", "WARNING", *flags]
    if count > 1:
        command += ["--api-server-count", str(count)]
    front = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    try:
        wait_line(front, r"(eclectus serving)")
        run_client(port, 1.0, args)  # warm-up
        cpu0, engine0 = tree_cpu_s(front.pid), tree_cpu_s(engine.pid)
        num, elapsed, client_cpu = run_client(port, args.seconds, args)
        cpu, engine_cpu = tree_cpu_s(front.pid) - cpu0, tree_cpu_s(engine.pid) - engine0
        num = max(num, 1)
        return {
            "rps": num / elapsed,
            "cpu_ms": 1000 * cpu / num,
            "engine_ms": 1000 * engine_cpu / num,
            "client_ms": 1000 * client_cpu / num,
        }
    finally:
        front.terminate()
        front.wait(timeout=60)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eclectus.benchmarks.front")
    parser.add_argument("--counts", default="1,2", help="front sizes to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument(
        "--front-flags",
        action="append",
        default=None,
        help="more `eclectus serve` flags; repeat it for one front per set, alternated",
    )
    parser.add_argument(
        "--token-delay", type=float, default=0.0, metavar="S", help="the engine's token pace"
    )
    parser.add_argument(
        "--load-client",
        choices=("wrk", "python"),
        default="wrk" if shutil.which("wrk") else "python",
        help="wrk (the default where it is on PATH) or the raw-socket Python client",
    )
    parser.add_argument("--client", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client is not None:
        total = asyncio.run(
            _client(args.client, args.seconds, args.concurrency, args.max_tokens, args.stream)
        )
        print(total, time.process_time())
        return
    if args.load_client == "wrk" and shutil.which("wrk") is None:
        parser.error("--load-client wrk: wrk is not on PATH (apt install wrk)")
    fronts: list[Front] = [
        (int(count), tuple(flags.split()))
        for count in args.counts.split(",")
        for flags in args.front_flags or [""]
    ]
    print(f"load client: {args.load_client}, token delay {args.token_delay} s", flush=True)
    delay = args.token_delay
    engine = subprocess.Popen(
        [sys.executable, "-m", "eclectus.benchmarks.instant_engine", f"--token-delay={delay}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    results: dict[Front, list[dict[str, float]]] = {f: [] for f in fronts}
    try:
        url = wait_line(engine, r"on (http://\S+/v1)")
        for round_ in range(args.rounds):
            for front in fronts if round_ % 2 == 0 else fronts[::-1]:  # none always first
                result = run_once(engine, url, front, args)
                results[front].append(result)
                load = os.getloadavg()[0]
                print(
                    f"round {round_} {front_label(front)}: {result['rps']:.0f} req/s, "
                    f"CPU/req: front {result['cpu_ms']:.2f} ms, engine "
                    f"{result['engine_ms']:.2f} ms, client {result['client_ms']:.2f} ms "
                    f"(load {load:.2f})",
                    flush=True,
                )
    finally:
        engine.kill()
        engine.wait()
    first = results[fronts[0]]
    base = statistics.median(r["rps"] for r in first)
    for front in fronts:
        count = front[0]
        rps = [r["rps"] for r in results[front]]
        cpu = [r["cpu_ms"] for r in results[front]]
        ratios = [r / (count * b["rps"]) for r, b in zip(rps, first, strict=True)]
        cpu_ratios = [r["cpu_ms"] / b["cpu_ms"] for r, b in zip(results[front], first, strict=True)]
        print(
            f"{front_label(front)}: {statistics.median(rps):.0f} req/s "
            f"({min(rps):.0f}-{max(rps):.0f}), {statistics.median(cpu):.2f} ms CPU/req "
            f"({min(cpu):.2f}-{max(cpu):.2f}), {statistics.median(rps) / base:.2f}x "
            f"{front_label(fronts[0])}; per round vs N x the first: "
            f"{', '.join(f'{x:.2f}' for x in ratios)}; CPU/req per round vs the first: "
            f"{', '.join(f'{x:.2f}' for x in cpu_ratios)}"
        )


if __name__ == "__main__":
    main()
