"""The PNG plots: the metric against each swept parameter (median, min–max bars, one line per
system, the lower bound dashed), and one run's calls on a timeline per system."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eclectus.evals.harness import BoundRecord, RunRecord
from eclectus.evals.summary import PointSummary
from eclectus.evals.workloads import Workload


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def sweep_plot(
    out_dir: Path,
    workload: Workload,
    field: str,
    summary: list[PointSummary],
    bounds: list[BoundRecord],
    engines: dict[str, str],
) -> str:
    """Plot ``workload``'s metric against ``field``; the file name (mutates disk)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = [s for s in summary if s.workload == workload.name and s.field == field]
    for system in dict.fromkeys(s.system for s in rows):
        mine = [s for s in rows if s.system == system]
        xs = [float(s.value) for s in mine]
        ys = [s.median for s in mine]
        err = [[s.median - s.low for s in mine], [s.high - s.median for s in mine]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=system)
    for engine in dict.fromkeys(engines.values()):
        mine_b = [
            b
            for b in bounds
            if b.workload == workload.name and b.field == field and b.engine == engine
        ]
        if mine_b:
            ax.plot(
                [float(b.value) for b in mine_b],
                [b.seconds for b in mine_b],
                "--",
                alpha=0.6,
                label=f"lower bound ({engine})",
            )
    ax.set_xlabel(field)
    ax.set_ylabel("seconds" if workload.metric == "wall_s" else workload.metric)
    ax.set_title(f"{workload.name}: median, min–max")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    fig.tight_layout()
    name = f"{workload.name}-{field.replace('.', '_')}.png"
    fig.savefig(out_dir / name, dpi=100)
    plt.close(fig)
    return name


def span_colors(runs: list[RunRecord]) -> dict[str, str]:
    """A color per span label (a part of the app: chat, analytics, background...), the same
    in every row, in order of first appearance (pure)."""
    labels = dict.fromkeys(label for run in runs for _, _, label in sorted(run.spans))
    return {label: f"C{i % 10}" for i, label in enumerate(labels)}


def timeline_plot(out_dir: Path, workload: Workload, runs: list[RunRecord]) -> str | None:
    """One measured run per system at the first point, its calls as bars; the file name, or
    None when no run recorded spans (mutates disk)."""
    first = [r for r in runs if r.workload == workload.name and r.rep == 0]
    if not first or not any(r.spans for r in first):
        return None
    point = (first[0].field, repr(first[0].value))
    chosen = [r for r in first if (r.field, repr(r.value)) == point]
    fig = timeline_figure(f"{workload.name} at {point[0]}={first[0].value}", chosen)
    name = f"{workload.name}-timeline.png"
    fig.savefig(out_dir / name, dpi=100)
    _pyplot().close(fig)
    return name


def timeline_figure(title: str, chosen: list[RunRecord]) -> Any:
    """One row per run, its calls as bars colored by the part of the app that made them
    (chat, background job...), a legend of those parts and of the run's end (pure: a new
    matplotlib Figure)."""
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(chosen), 1, figsize=(7, 1.6 + 1.1 * len(chosen)), sharex=True, squeeze=False
    )
    colors = span_colors(chosen)
    for ax, run in zip(axes[:, 0], chosen, strict=True):
        for i, (start, end, label) in enumerate(sorted(run.spans)):
            ax.barh(i, end - start, left=start, height=0.8, color=colors[label])
        ax.axvline(run.wall_s, color="black", linewidth=1)
        ax.set_ylabel(f"{run.system}\n({run.span_source})", fontsize=7)
        ax.set_yticks([])
    axes[-1, 0].set_xlabel("seconds since the run started")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    handles.append(plt.Line2D([0], [0], color="black", linewidth=1))
    labels = [*colors, "the run's end"]
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle(f"{title}: one run's calls", fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))  # room for the legend below
    return fig
