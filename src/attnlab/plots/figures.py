"""Matplotlib helpers for attention maps and other figures.

Everything here builds :class:`matplotlib.figure.Figure` objects directly, each with its own Agg canvas, and never
touches pyplot's global state: no figure is registered with pyplot (nothing to ``plt.close``, nothing leaks when a
callback renders figures every epoch), the process-wide backend is left alone (notebooks keep theirs), and
figures can be rendered from any thread. Nothing calls ``plt.show``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..files.atomic import write_atomic

__all__ = ["attention_heatmap_figure", "save_figure", "figure_to_array", "new_figure", "file_stem", "layer_order",
           "MAX_LABELED_TOKENS"]

#: Above this many tokens on an axis, tick labels are left out (they would be unreadable).
MAX_LABELED_TOKENS = 64


def new_figure(figsize: tuple[float, float] = (6.4, 4.8), dpi: float = 100, **kwargs) -> Figure:
    """A pyplot-free figure with an Agg canvas attached (thread-safe, garbage-collected like any object)."""
    fig = Figure(figsize=figsize, dpi=dpi, **kwargs)
    FigureCanvasAgg(fig)
    return fig


def _to_numpy(weights) -> np.ndarray:
    if hasattr(weights, "detach"):  # torch.Tensor (any dtype, e.g. bf16, any device)
        weights = weights.detach().float().cpu().numpy()
    return np.asarray(weights, dtype=np.float32)


def _fit_labels(labels: Sequence[str] | None, n: int) -> list[str] | None:
    """Labels for an axis of n tokens: truncated to n; None when missing, too short, or n is too large."""
    if labels is None or n > MAX_LABELED_TOKENS or len(labels) < n:
        return None
    return [str(s) for s in list(labels)[:n]]


def attention_heatmap_figure(
    weights,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    title: str = "",
    max_heads: int = 8,
) -> Figure:
    """One layer's attention weights as a grid of heatmaps, one panel per head, with a shared colorbar.

    Args:
        weights: (H, Tq, Tk) tensor or array (a single (Tq, Tk) map is taken as one head). Rows are queries,
            columns keys.
        x_labels: key tokens (columns), drawn rotated under the lowest panel of each column.
        y_labels: query tokens (rows), drawn left of the panels of the first column.
            Labels are left out on an axis longer than ``MAX_LABELED_TOKENS`` or when fewer labels than tokens
            are given; extra labels are ignored.
        title: figure title.
        max_heads: draw at most this many heads (the first ones); the title says how many were left out.
    """
    w = _to_numpy(weights)
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        raise ValueError(f"expected weights of shape (H, Tq, Tk), got {tuple(w.shape)}")
    n_total = w.shape[0]
    w = w[: max(1, max_heads)]
    n_heads, tq, tk = w.shape
    xl, yl = _fit_labels(x_labels, tk), _fit_labels(y_labels, tq)

    ncols = min(n_heads, 4)
    nrows = math.ceil(n_heads / ncols)
    fontsize = 8 if max(tq, tk) <= 24 else 6 if max(tq, tk) <= 48 else 5

    # Fixed layout computed in inches (constrained/tight layout would double the drawing time).
    def label_space(labels: list[str] | None) -> float:
        longest = max((len(s) for s in labels), default=1) if labels is not None else 3
        return 0.6 * fontsize / 72 * longest + 0.15

    side = min(6.0, max(2.2, 0.09 * max(tq, tk) + 0.8))  # panel side grows with the number of tokens
    left, bottom = 0.35 + label_space(yl), 0.35 + label_space(xl)
    top, right = 0.65, 1.3  # right: the colorbar, its ticks and its label
    wgap = 0.25 + (0.0 if yl is not None else label_space(None))
    hgap = 0.4 + (0.0 if xl is not None else label_space(None))  # labels only under the lowest panels
    width = left + ncols * side + (ncols - 1) * wgap + right
    height = bottom + nrows * side + (nrows - 1) * hgap + top
    fig = new_figure(figsize=(width, height), dpi=100)
    axes = fig.subplots(
        nrows, ncols, squeeze=False,
        gridspec_kw=dict(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                         wspace=wgap / side, hspace=hgap / side),
    )
    vmax = float(np.nanmax(w)) if w.size and np.isfinite(w).any() else 1.0
    vmax = vmax if vmax > 0 else 1.0
    image = None
    # Token labels go on the outer panels only (the left column, the lowest panel of each column): tick labels
    # are by far the slowest part of drawing, and every panel shares the same tokens.
    lowest = {c: max(h for h in range(n_heads) if h % ncols == c) for c in range(ncols)}
    for h in range(nrows * ncols):
        ax = axes[h // ncols][h % ncols]
        if h >= n_heads:
            ax.set_axis_off()
            continue
        image = ax.imshow(w[h], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=9)
        ax.tick_params(labelsize=fontsize)
        if h == lowest[h % ncols]:
            ax.set_xlabel("key", fontsize=8)
            if xl is not None:
                ax.set_xticks(range(tk), xl, rotation=90, fontsize=fontsize)
        else:
            ax.tick_params(labelbottom=False)
        if h % ncols == 0:
            ax.set_ylabel("query", fontsize=8)
            if yl is not None:
                ax.set_yticks(range(tq), yl, fontsize=fontsize)
        else:
            ax.tick_params(labelleft=False)
    if image is not None:
        cax = fig.add_axes((1 - (right - 0.2) / width, bottom / height, 0.15 / width, 1 - (top + bottom) / height))
        fig.colorbar(image, cax=cax, label="attention weight")
    suffix = f" (first {n_heads} of {n_total} heads)" if n_total > n_heads else ""
    if title or suffix:
        fig.suptitle(f"{title}{suffix}", fontsize=10)
    return fig


def file_stem(name: str) -> str:
    """A file name for a module name or key: characters other than letters, digits, ``.``, ``-``, ``_`` -> ``_``."""
    return re.sub(r"[^\w.\-]+", "_", name) or "attention"


def layer_order(name: str) -> tuple:
    """Sort key of module names that puts ``blocks.10`` after ``blocks.2``."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def save_figure(fig: Figure, path: str | Path, dpi: float = 100) -> Path:
    """Write ``fig`` as a PNG at ``path`` (parent folders created); returns the path."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    return write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=dpi), durable=False)


def figure_to_array(fig: Figure) -> np.ndarray:
    """Render ``fig`` to an RGB ``uint8`` array of shape (H, W, 3), for loggers that take arrays."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
