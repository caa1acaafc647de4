"""Small, uniform figures for the results page (matplotlib, Agg, ~60 KB PNGs)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def figure(ncols: int = 1, nrows: int = 1, width: float = 4.2, height: float = 3.2):
    """A figure of ncols × nrows panels; returns (fig, flat list of axes)."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def curve(ax, job, key: str, *fmt, **style) -> tuple[list[int], list[float]]:
    """Plot one logged metric of a job against its steps; returns (steps, values) for the table."""
    steps, values = job.curve(key)
    ax.plot(steps, values, *fmt, **style)
    return steps, values


def grouped_bars(ax, series: dict[str, list[float]], width: float = 0.4, label_fmt: str | None = None,
                 styles: dict[str, dict] | None = None) -> list:
    """One bar per group and series, the series side by side around each group's x = 0, 1, …; ``label_fmt``
    (e.g. "{:.2f}") writes each bar's value above it. Returns the bar containers, one per series."""
    containers = []
    for j, (label, ys) in enumerate(series.items()):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(ys))]
        bars = ax.bar(xs, ys, width, label=label, **(styles or {}).get(label, {}))
        if label_fmt:
            ax.bar_label(bars, [label_fmt.format(y) for y in ys], fontsize=7, padding=2)
        containers.append(bars)
    return containers


def save(fig, path: Path, title: str | None = None) -> None:
    if title:
        fig.suptitle(title, fontsize=10)
    for ax in fig.axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
