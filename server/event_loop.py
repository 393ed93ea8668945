"""The server's event loop: uvloop where it is installed, as vLLM's and SGLang's API servers
run (uvicorn's ``--loop auto``), else asyncio's own.

Every streamed token crosses the front as one read from the engine and one write to the
client, each in its own loop iteration when tokens trickle in at the engine's pace. asyncio's
loop and socket transports are Python; uvloop's are C (libuv), which is most of what a token
costs the front between the engine's steps (docs/benchmarks.md, session 9).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

LoopName = Literal["auto", "asyncio", "uvloop"]
LOOPS: tuple[LoopName, ...] = ("auto", "asyncio", "uvloop")
T = TypeVar("T")


def loop_factory(name: LoopName = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new loop of kind ``name`` ("auto": uvloop when installed). ValueError
    for uvloop asked for and not installed, or an unknown name."""
    if name not in LOOPS:
        raise ValueError(f"--loop {name}: choose from {', '.join(LOOPS)}")
    if name == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if name == "auto":
            return asyncio.new_event_loop
        raise ValueError("--loop uvloop: uvloop is not installed (pip install uvloop)") from None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], factory: Callable[[], asyncio.AbstractEventLoop]) -> T:
    """``asyncio.run(main)`` on a loop ``factory`` makes (:func:`loop_factory`; blocking)."""
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
