"""The engine core's own process: what crosses the pipe, and the child's entry point.

:class:`~eclectus.server.engine.process_engine.ProcessEngine` (the front, in the server's
process) starts :func:`core_main` in a spawned child that owns the ``LLMEngine`` and steps it
(:class:`~eclectus.server.engine.core_engine.EngineCore`), as vLLM's EngineCore runs beside its
API server: the step never shares a GIL with the event loop that parses requests and renders
streams. One ``multiprocessing`` pipe joins them; every message is one of the small frozen
dataclasses below, pickled. The child sends one :class:`StepOutputs` per engine step (every
request's news of that step together, and the stats after it), never one message per token.

This module imports neither torch nor the engine: the front imports it to name the child's
entry point, and the child imports the engine inside :func:`core_main`.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Literal

from eclectus.protocol import SamplingParams
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.request import (
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestFailed,
)

# ---- front -> core ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CoreCommand:
    """One instruction to the core. ``add``: queue ``request`` (a constrained one is compiled
    first, off the step); ``abort`` / ``unpin``: as the Backend methods, by ``request_id``;
    ``reset_cache``: as ``Backend.reset_prefix_cache``;
    ``check``: compile ``sampling``'s constraint and answer :class:`ConstraintChecked` with
    ``call_id``; ``shutdown``: stop stepping and exit."""

    kind: Literal["add", "abort", "unpin", "reset_cache", "check", "shutdown"]
    request_id: str = ""
    request: EngineRequest | None = None
    sampling: SamplingParams | None = None
    call_id: int = 0


# ---- core -> front ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CoreReady:
    """The model is loaded: the most tokens one request may hold (window and KV pool) and the
    first stats snapshot."""

    max_model_len: int
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class CoreFailed:
    """The core could not start. ``bad_config``: the cause was a ValueError (a model that
    cannot be found or loaded as configured), which ``eclectus serve`` reports in one line."""

    message: str
    bad_config: bool


@dataclass(frozen=True, slots=True)
class StepOutputs:
    """Everything one iteration of the core produced: outputs and failures in order, and the
    stats taken after them (so a reader that sees an output sees its tokens counted)."""

    items: tuple[EngineOutput | RequestFailed, ...]
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class ConstraintChecked:
    """The answer to a ``check`` command: None when the constraint compiles, else why not."""

    call_id: int
    refusal: str | None


# The child's command line: not ``multiprocessing``'s spawn, which re-imports the parent's
# ``__main__`` (a script without a main guard would start a second server), and not ``-m`` of
# this module (its message classes would be ``__main__``'s, which the front cannot unpickle).
CHILD_CODE = "from eclectus.server.engine.core_process import main; main()"


def main() -> None:
    """The child's entry point: ``argv[1]`` is the file descriptor of its end of a connected
    socket pair; the first message on it is the :class:`EngineConfig` (blocking)."""
    conn = Connection(int(sys.argv[1]))
    config: EngineConfig = conn.recv()
    core_main(config, conn)


def core_main(config: EngineConfig, conn: Connection) -> None:
    """The child's entry point: load the engine, say :class:`CoreReady` (or
    :class:`CoreFailed`), then step until a ``shutdown`` command or the pipe closes (blocking).

    SIGINT is ignored: Ctrl-C reaches the whole process group, and the front, not the signal,
    decides when the core stops (it drains first). A front that dies closes the pipe, which
    ends the core too, so no core outlives its server."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from eclectus.server.engine.core_engine import EngineCore

        core = EngineCore(config, conn)
    except Exception as exc:  # reported to the front, which raises it where it waits
        conn.send(CoreFailed(f"{type(exc).__name__}: {exc}", isinstance(exc, ValueError)))
        return
    conn.send(CoreReady(core.engine.max_model_len, core.stats()))
    core.serve()
