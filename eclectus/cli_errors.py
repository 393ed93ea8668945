"""Everyday mistakes as one line: what went wrong and what to do, no traceback.

Every ``eclectus`` subcommand runs through :func:`run_guarded`. An exception that reaches it
is explained by the first of its chain (the exception, then its causes) that
:func:`explain` knows — a port in use, a model or file that is not there, a server that does
not answer, a CUDA device torch cannot use, a bad value — and printed as
``eclectus CMD: message``. Anything else is one line naming the exception and ``--debug``;
``--debug`` lets every exception through with its traceback.
"""

from __future__ import annotations

import argparse
import errno
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

USAGE = 2  # the user's input was wrong (as argparse exits)
FAILED = 1  # the environment was: a port, a server, a device
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


class CommandError(Exception):
    """An error whose message is already the line for the user (``status``: the exit
    status)."""

    def __init__(self, message: str, status: int = FAILED) -> None:
        super().__init__(message)
        self.status = status


def refused_connection(exc: BaseException) -> bool:
    """Whether ``exc`` or one of its causes is a refused or failed connection (pure)."""
    from eclectus.adapters.client.errors import ConnectionError as ClientConnectionError

    return any(
        isinstance(link, (ConnectionRefusedError, ClientConnectionError))
        or type(link).__name__ in ("APIConnectionError", "ConnectError", "URLError")
        for link in _chain(exc)
    )


@dataclass(frozen=True, slots=True)
class Explained:
    """One line for the user and the exit status that goes with it."""

    message: str
    status: int


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its causes (explicit, else implicit), without repeats."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _address_in_use(exc: OSError) -> Explained:
    found = re.search(r"\('([^']*)', (\d+)\)", str(exc))
    where = f"{found.group(1)}:{found.group(2)}" if found else "the address"
    return Explained(
        f"{where} is already in use (another server?): stop it, or pass another --port "
        "(--port 0 picks a free one)",
        FAILED,
    )


def _no_cuda(exc: BaseException) -> Explained | None:
    text = str(exc)
    if "CUDA" not in text and "NVIDIA" not in text:
        return None
    return Explained(
        f"this torch cannot use a CUDA device ({text.strip().rstrip('.')}): pass --device cpu, "
        "or install a CUDA build of torch on a machine with a GPU",
        FAILED,
    )


def _unreachable(exc: BaseException) -> Explained:
    return Explained(
        f"{exc}: is an Eclectus server running there? Start one (`eclectus serve`) or fix "
        "the URL you gave",
        FAILED,
    )


def _explain_one(exc: BaseException) -> Explained | None:
    """The line for this exception alone, or None when it is not an everyday mistake."""
    from eclectus.adapters.client.errors import ConnectionError as ClientConnectionError

    if isinstance(exc, CommandError):
        return Explained(str(exc), exc.status)
    if isinstance(exc, KeyboardInterrupt):
        return Explained("interrupted", INTERRUPTED)
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return _address_in_use(exc)
    if isinstance(exc, ClientConnectionError):
        return _unreachable(exc)
    if isinstance(exc, ConnectionRefusedError):
        return _unreachable(exc)
    if isinstance(exc, FileNotFoundError) and exc.filename is not None:
        return Explained(f"no such file or directory: {exc.filename}", USAGE)
    if isinstance(exc, (IsADirectoryError, PermissionError)):
        return Explained(str(exc), USAGE)
    if isinstance(exc, (AssertionError, RuntimeError)):
        return _no_cuda(exc)
    if isinstance(exc, ValueError):  # our boundaries' validation errors name what was wrong
        return Explained(str(exc), USAGE)
    return None


def explain(exc: BaseException) -> Explained:
    """The line for ``exc``: the first of its chain that is an everyday mistake, else one
    naming the exception and ``--debug`` (pure)."""
    for link in _chain(exc):
        found = _explain_one(link)
        if found is not None:
            return found
    name = type(exc).__name__
    return Explained(f"unexpected {name}: {exc} (rerun with --debug for the traceback)", FAILED)


def run_guarded(
    prog: str,
    run: Callable[[argparse.Namespace], int],
    args: argparse.Namespace,
    *,
    debug: bool = False,
) -> int:
    """``run(args)``'s exit status; an exception becomes one line on stderr and a status
    (:func:`explain`), unless ``debug``."""
    try:
        return run(args)
    except (Exception, KeyboardInterrupt) as exc:
        if debug:
            raise
        found = explain(exc)
        print(f"{prog}: {found.message}", file=sys.stderr, flush=True)
        return found.status
