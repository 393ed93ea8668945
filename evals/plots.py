"""The PNG plots: the metric against each swept parameter (median, min–max bars, one line per
system, the lower bound dashed), and one run's calls on a timeline per system."""

from __future__ import annotations

from pathlib import Path

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


def timeline_plot(out_dir: Path, workload: Workload, runs: list[RunRecord]) -> str | None:
    """One measured run per system at the first point, its calls as bars; the file name, or
    None when no run recorded spans (mutates disk)."""
    first = [r for r in runs if r.workload == workload.name and r.rep == 0]
    if not first or not any(r.spans for r in first):
        return None
    point = (first[0].field, repr(first[0].value))
    chosen = [r for r in first if (r.field, repr(r.value)) == point]
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(chosen), 1, figsize=(7, 1.2 + 1.1 * len(chosen)), sharex=True, squeeze=False
    )
    for ax, run in zip(axes[:, 0], chosen, strict=True):
        spans = sorted(run.spans)
        for i, (start, end) in enumerate(spans):
            ax.barh(i, end - start, left=start, height=0.8)
        ax.axvline(run.wall_s, color="black", linewidth=1)
        ax.set_ylabel(f"{run.system}\n({run.span_source})", fontsize=7)
        ax.set_yticks([])
    axes[-1, 0].set_xlabel("seconds since the run started (black line: the run's end)")
    fig.suptitle(f"{workload.name} at {point[0]}={first[0].value}: one run's calls", fontsize=9)
    fig.tight_layout()
    name = f"{workload.name}-timeline.png"
    fig.savefig(out_dir / name, dpi=100)
    plt.close(fig)
    return name
