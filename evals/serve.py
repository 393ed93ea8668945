"""``python -m eclectus.evals.serve``: ``eclectus serve`` with its engine's calls traced.

The evals start their Eclectus server in its own process (as vLLM runs in its own) with
every ``eclectus serve`` flag — the engine budgets come from the :class:`Budget` through the
same flags a user passes (:meth:`Budget.serve_args`) — plus ``--trace-file``: the engine is
wrapped in a :class:`TracingBackend` that appends one line per finished engine request, for
the timelines (:mod:`eclectus.evals.trace`). Serving itself is :func:`eclectus.server.main.run`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eclectus.evals.trace import TracingBackend
from eclectus.server.backend import Backend
from eclectus.server.flags import add_arguments
from eclectus.server.main import run


def build_parser() -> argparse.ArgumentParser:
    """``eclectus serve``'s flags and ``--trace-file`` (pure)."""
    parser = argparse.ArgumentParser(prog="python -m eclectus.evals.serve", description=__doc__)
    add_arguments(parser)
    parser.add_argument(
        "--trace-file", type=Path, default=None, help="append engine call spans here (JSONL)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT, tracing when ``--trace-file`` is given; 2 on bad flags."""
    args = build_parser().parse_args(argv)
    trace_file: Path | None = args.trace_file

    def traced(engine: Backend) -> Backend:
        assert trace_file is not None
        return TracingBackend(engine, trace_file)  # type: ignore[return-value]

    return run(args, None if trace_file is None else traced)


if __name__ == "__main__":
    sys.exit(main())
