"""The static plan of a chain: each runnable, and whether it lowers onto the server or
runs on the client as a cut. (Whether a lowerable step cuts can still depend on the input,
e.g. a mustache ``{{x}}`` over a generated value; the run's trace shows what happened.)"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import Runnable

from eclectus.adapters.langchain.compiler.registry import lowering_for


def children(runnable: Any) -> list[tuple[str, Any]]:
    """The (label, child) pairs of a composite runnable; [] for a leaf (pure)."""
    if hasattr(runnable, "steps__"):
        return list(runnable.steps__.items())
    if hasattr(runnable, "steps") and isinstance(runnable.steps, list):
        return [(str(i), step) for i, step in enumerate(runnable.steps)]
    for name in ("mapper", "bound"):
        child = getattr(runnable, name, None)
        if isinstance(child, Runnable):
            return [(name, child)]
    return []


def plan_lines(runnable: Runnable, label: str = "", depth: int = 0) -> list[str]:
    """Indented lines: ``server`` or ``CUT`` per runnable, composites expanded (pure)."""
    where = "server" if lowering_for(runnable) is not None else "CUT (client)"
    prefix = f"{label}: " if label else ""
    lines = [f"{'  ' * depth}{prefix}{runnable.get_name()} -> {where}"]
    if where == "server":
        for child_label, child in children(runnable):
            lines.extend(plan_lines(child, child_label, depth + 1))
    return lines


def plan_text(runnable: Runnable) -> str:
    """The plan as one text block (pure)."""
    return "\n".join(["plan:", *plan_lines(runnable, depth=1)])
