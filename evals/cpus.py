"""Where a measurement's processes run: ``--cpu-layout shared|apart|ENGINE/OTHER``.

On a GPU host the model runs on the accelerator: a front, an API server or a client busy on
the host's cores does not slow the engine's steps. On a CPU eval machine the model runs on
the same few cores as everything else, so every millisecond of CPU a front spends is taken
from the engine's steps, and a hop's cost reads as the engine's. The layouts:

- ``shared`` (the default): every process may run on every core; the OS places them.
- ``apart``: the processes that run the model (vLLM's EngineCore and its workers, the
  built-in engine's core process) on the last core this process may use, every other one
  (API servers, Eclectus fronts, clients, this eval) on the rest, as on a host whose
  accelerator is its own. Needs at least 2 cores.
- ``ENGINE/OTHER``: the same with the core lists given, as ``taskset`` takes them
  (``1/0``, ``2-3/0-1``, ``3/0,1``).

The eval pins itself to the other cores before it starts anything, so every process it
starts inherits them; once a server answers, its model-running processes are moved, every
thread of them (:meth:`CpuLayout.pin_engines`). Both systems of a comparison get the same
layout, so neither gains a core the other lacks.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CpuLayout:
    """``engine_cpus`` / ``other_cpus``: the cores of the model-running processes and of
    everything else; both None for ``shared`` (nobody is pinned)."""

    name: str = "shared"
    engine_cpus: frozenset[int] | None = None
    other_cpus: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if (self.engine_cpus is None) != (self.other_cpus is None):
            raise ValueError("a CPU layout pins both the engines and the rest, or neither")
        if self.engine_cpus is not None and self.other_cpus is not None:
            if not self.engine_cpus or not self.other_cpus:
                raise ValueError(f"--cpu-layout {self.name}: each side needs a core")
            if self.engine_cpus & self.other_cpus:
                raise ValueError(f"--cpu-layout {self.name}: the two sides share a core")

    @property
    def pinned(self) -> bool:
        return self.engine_cpus is not None

    @classmethod
    def parse(cls, text: str, available: frozenset[int] | None = None) -> CpuLayout:
        """The layout ``text`` names, on the cores ``available`` (default: those this process
        may use) (pure but for reading the affinity). ValueError names what is wrong."""
        cores = available if available is not None else frozenset(os.sched_getaffinity(0))
        if text == "shared":
            return cls()
        if text == "apart":
            if len(cores) < 2:
                raise ValueError(f"--cpu-layout apart needs 2 cores or more; this has {len(cores)}")
            last = max(cores)
            return cls("apart", frozenset({last}), cores - {last})
        engine, sep, other = text.partition("/")
        if not sep:
            raise ValueError(f"--cpu-layout {text!r}: choose shared, apart, or ENGINE/OTHER cores")
        layout = cls(text, _cores(engine, text), _cores(other, text))
        named = (layout.engine_cpus or frozenset()) | (layout.other_cpus or frozenset())
        if named - cores:
            raise ValueError(f"--cpu-layout {text}: no core {sorted(named - cores)} here")
        return layout

    def describe(self) -> str:
        """The layout in words, for reports (pure)."""
        if not self.pinned:
            return "shared (every process on every core)"
        engines, rest = _list(self.engine_cpus), _list(self.other_cpus)
        return f"apart: engines on cores {engines}, the rest on {rest}"

    def pin_self(self) -> None:
        """Pin every thread of this process to the other cores, so what it starts from now on
        starts there (mutates the process's affinity; nothing for ``shared``)."""
        if self.other_cpus is not None:
            pin_process(os.getpid(), self.other_cpus)

    def pin_engines(self, pids: list[int]) -> None:
        """Move every thread of each of ``pids`` to the engine cores (mutates those
        processes' affinity; nothing for ``shared``)."""
        if self.engine_cpus is not None:
            for pid in pids:
                pin_process(pid, self.engine_cpus)


SHARED = CpuLayout()  # nobody pinned: the default


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Set the affinity of every thread of ``pid`` (a thread started later inherits its
    starter's); a thread or process gone meanwhile is skipped."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, FileNotFoundError):
            continue


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (reads /proc)."""
    return _children_of().get(pid, [])


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (reads /proc), children before grandchildren."""
    children_of = _children_of()
    found, frontier = [], [pid]
    while frontier:
        frontier = [c for p in frontier for c in children_of.get(p, [])]
        found += frontier
    return found


def _children_of() -> dict[int, list[int]]:
    """Every live process's children, by parent pid (reads /proc once)."""
    children_of: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children_of.setdefault(ppid, []).append(int(stat.parent.name))
    return children_of


def add_layout_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--cpu-layout`` flag (mutates ``parser``)."""
    parser.add_argument(
        "--cpu-layout",
        default="shared",
        metavar="shared|apart|ENGINE/OTHER",
        help="where processes run: shared (the OS places them), apart (the model-running "
        "processes on the last core, the rest on the others, as on a host whose accelerator "
        "is its own), or ENGINE/OTHER core lists (taskset's syntax: 1/0)",
    )


def _cores(text: str, whole: str) -> frozenset[int]:
    """The cores a taskset-style list names: ``0``, ``0,2``, ``0-3`` (pure)."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            first, dash, last = part.partition("-")
            cores.update(range(int(first), int(last if dash else first) + 1))
    except ValueError:
        raise ValueError(f"--cpu-layout {whole}: {text!r} is not a list of cores") from None
    return frozenset(cores)


def _list(cores: frozenset[int] | None) -> str:
    return ",".join(map(str, sorted(cores or ())))
