"""The load eval's plots: p95 latency against the arrival rate (a panel per program type, a
line per series; a program that did not finish counts as infinitely late, so a line stops
where a type's p95 is unbounded), and goodput against the rate, each series' capacity (when
measured) a dashed vertical line in its colour. Medians over the rounds, min-max bars."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from eclectus.evals.load.stats import PointSummary, Spread

Points = dict[str, dict[float, PointSummary]]


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _line(ax, rates: list[float], spreads: list[Spread | None], label: str) -> Any:  # type: ignore[no-untyped-def]
    """One series' medians with min-max bars; its colour (None: nothing finite to draw)."""
    shown = [(r, s) for r, s in zip(rates, spreads, strict=True) if s and math.isfinite(s.median)]
    if not shown:
        return None
    xs = [r for r, _ in shown]
    ys = [s.median for _, s in shown]
    low = [s.median - s.low for _, s in shown]
    high = [(s.high - s.median) if math.isfinite(s.high) else 0.0 for _, s in shown]
    bars = ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=label)
    return bars.lines[0].get_color()


def latency_plot(out_dir: Path, points: Points, kinds: list[str], slo: dict[str, float]) -> str:
    """p95 latency against the rate, one panel per type (its largest shape's SLO dashed);
    the file name (mutates disk)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(kinds), figsize=(4 * len(kinds), 3.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for series, by_rate in points.items():
            rates = sorted(by_rate)
            _line(ax, rates, [by_rate[r].type_spread(kind, "p95_s") for r in rates], series)
        if kind in slo:
            ax.axhline(slo[kind], linestyle="--", color="grey", linewidth=1)
        ax.set_title(kind)
        ax.set_xlabel("arrivals (programs/s)")
        ax.set_ylabel("p95 latency (s)")
        ax.set_yscale("log")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    name = "load-latency.png"
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name


def goodput_plot(out_dir: Path, points: Points, capacity: dict[str, float] | None = None) -> str:
    """Goodput (programs/s within the SLO) against the rate, and each series' ``capacity``
    (programs/s it drained a burst at) where given; the file name (mutates disk)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    capacity = capacity or {}
    for series, by_rate in points.items():
        rates = sorted(by_rate)
        color = _line(ax, rates, [by_rate[r].spread("goodput_per_s") for r in rates], series)
        if series in capacity:
            label = f"{series} capacity"
            ax.axvline(capacity[series], linestyle="--", linewidth=1, color=color, label=label)
    top = max((r for by_rate in points.values() for r in by_rate), default=1.0)
    ax.plot([0, top], [0, top], linestyle=":", color="grey", linewidth=1, label="arrivals")
    ax.set_xlabel("arrivals (programs/s)")
    ax.set_ylabel("goodput (programs/s within the SLO)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    name = "load-goodput.png"
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name
