"""GraphTrace: what one compiled run built, for printing (calls, ops, cuts, nesting)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(slots=True)
class GraphTrace:
    """An indented log of the graph a lowering built. Mutated only by the lowering."""

    lines: list[str] = field(default_factory=list)
    num_calls: int = 0
    num_ops: int = 0
    cuts: list[tuple[str, str]] = field(default_factory=list)  # (runnable name, reason)
    switched: list[str] = field(default_factory=list)  # LangGraph routers run on the server
    # Python evaluation (adapters/pyeval): where a value was fetched mid-function and why
    breaks: list[tuple[str, str]] = field(default_factory=list)
    _depth: int = 0

    @contextmanager
    def nested(self, label: str) -> Iterator[None]:
        """Logs ``label`` and indents what is logged inside (mutates)."""
        self._add(label)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def call(self, label: str) -> None:
        """A model call declared on the server (mutates)."""
        self.num_calls += 1
        self._add(f"call   {label}")

    def op(self, label: str) -> None:
        """A server-side text op declared (mutates)."""
        self.num_ops += 1
        self._add(f"op     {label}")

    def node(self, label: str) -> None:
        """A step that lowered without server work of its own (mutates)."""
        self._add(f"node   {label}")

    def cut(self, name: str, reason: str) -> None:
        """A client-side cut: upstream resolved, ``name`` ran on the client (mutates)."""
        self.cuts.append((name, reason))
        self._add(f"CUT    {name}: runs on the client ({reason})")

    def graph_break(self, where: str, reason: str) -> None:
        """A graph break: evaluated Python needed a server value at ``where`` (a
        function and line), fetched it and went on concretely (mutates)."""
        self.breaks.append((where, reason))
        self._add(f"BREAK  {where}: {reason}")

    def python(self, label: str) -> None:
        """A note of the Python evaluator (a function evaluated or run as Python)."""
        self._add(f"python {label}")

    def merge(self, other: GraphTrace) -> None:
        """Appends ``other``'s log at the current indent, and its counts (mutates)."""
        self.num_calls += other.num_calls
        self.num_ops += other.num_ops
        self.cuts.extend(other.cuts)
        self.switched.extend(other.switched)
        self.breaks.extend(other.breaks)
        for line in other.lines:
            self._add(line)

    def render(self) -> str:
        """The whole trace as text, with a one-line summary first (pure)."""
        head = f"graph: {self.num_calls} call(s), {self.num_ops} op(s), {len(self.cuts)} cut(s)"
        if self.breaks:
            head += f", {len(self.breaks)} break(s)"
        return "\n".join([head, *self.lines])

    def _add(self, text: str) -> None:
        self.lines.append("  " * self._depth + text)
