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


def save(fig, path: Path, title: str | None = None) -> None:
    if title:
        fig.suptitle(title, fontsize=10)
    for ax in fig.axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
