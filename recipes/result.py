"""RecipeResult (what a run returns) and the short report ``eclectus run`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eclectus.models.presets import PRESET_NOTES
from eclectus.recipes.observe import CallSpan


def preset_note(model: str) -> str | None:
    """The report's note on a built-in model's text, or None for a checkpoint (pure)."""
    if model not in PRESET_NOTES:
        return None
    return (
        f"note: {PRESET_NOTES[model]}; pass --model PATH (a Hugging Face checkpoint "
        "directory) for real output."
    )


@dataclass(frozen=True, slots=True)
class RecipeOutput:
    """What a recipe function returns: its final text, the longest chain of dependent
    model calls it made (its dependency depth), the calls it planned, and extras."""

    output: str
    depth: int
    planned_calls: int
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RecipeResult:
    """One run of a recipe.

    ``num_calls``: model calls the server ran (Eclectus server counters, graph calls) or,
    for the OpenAI endpoint, calls the client made. ``depth``: the longest chain of
    dependent model calls. ``cache_hit_ratio``: prompt tokens served from the prefix cache
    over prompt tokens, from the server's counters; None when the server is not Eclectus.
    ``timeline``: client-observed call spans (empty for compiled runs, whose calls the
    client never sees one by one). ``notes``: what fell back or could not be measured.
    """

    name: str
    backend: str
    model: str
    output: str
    wall_s: float
    num_calls: int
    depth: int
    cache_hit_ratio: float | None
    details: dict[str, Any] = field(default_factory=dict)
    server_counters: dict[str, float] = field(default_factory=dict)
    timeline: list[CallSpan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def format_report(result: RecipeResult, max_output_chars: int = 2000) -> str:
    """The human report: numbers first, then the output (pure)."""
    ratio = "unknown" if result.cache_hit_ratio is None else f"{result.cache_hit_ratio:.1%}"
    lines = [
        f"recipe: {result.name}   backend: {result.backend}   model: {result.model}",
        f"wall time:              {result.wall_s:.2f} s",
        f"model calls:            {result.num_calls}",
        f"graph depth:            {result.depth}",
        f"prefix-cache hit ratio: {ratio}",
    ]
    for key, value in result.details.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        lines.append(f"{key + ':':24}{shown}")
    lines.extend(result.notes)
    note = preset_note(result.model)
    if note is not None:
        lines.append(note)
    output = result.output
    if len(output) > max_output_chars:
        output = output[:max_output_chars] + f"... [{len(result.output)} chars]"
    lines += ["", "output:", output]
    return "\n".join(lines)
