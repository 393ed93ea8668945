"""Frames a unit of work caused, across every session it touched.

A compiled run sends frames on its own session, but code it runs eagerly (a Python node's
own ``llm.invoke``, a cut) sends frames on other sessions too. :func:`counting` opens a
:class:`FrameMeter` in the current context; every frame any session sends while that
context is current (the session's coroutines run in the caller's context: bridge.py
submits them with it) is counted on it, so concurrent runs count only their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(slots=True)
class FrameMeter:
    """Frames sent while it was open (mutated by the sessions' outboxes)."""

    num_frames: int = 0


_METERS: ContextVar[tuple[FrameMeter, ...]] = ContextVar("eclectus_frame_meters", default=())


@contextmanager
def counting() -> Iterator[FrameMeter]:
    """A meter counting the frames sent in this context (and tasks and threads started
    from it with a copy of it) until the block ends; meters nest."""
    meter = FrameMeter()
    token = _METERS.set((*_METERS.get(), meter))
    try:
        yield meter
    finally:
        _METERS.reset(token)


def count_frame() -> None:
    """One frame left in the current context (mutates the open meters)."""
    for meter in _METERS.get():
        meter.num_frames += 1
