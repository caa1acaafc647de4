"""Figures for image models: attention of a patch over the image, attention rollout, confusion matrices.

Like :mod:`attnlab.plots.figures`, every figure is a pyplot-free :class:`~matplotlib.figure.Figure` with its own Agg
canvas (save it with :func:`attnlab.plots.figures.save_figure`).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .figures import new_figure

__all__ = ["image_to_display", "upsample_map", "patch_attention_figure", "rollout_figure", "confusion_matrix_figure"]


def image_to_display(image) -> np.ndarray:
    """(C, H, W) or (H, W) tensor/array -> (H, W) for grey or (H, W, 3) for colour, min-max scaled to [0, 1]."""
    x = image.detach().float().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image, np.float32)
    if x.ndim == 3:
        x = x[0] if x.shape[0] == 1 else np.transpose(x[:3], (1, 2, 0))
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def upsample_map(grid_map, size: tuple[int, int], mode: str = "bilinear") -> np.ndarray:
    """(gh, gw) -> (H, W) by interpolation (``nearest`` keeps the patch blocks visible)."""
    m = torch.as_tensor(np.asarray(grid_map, dtype=np.float32))[None, None]
    kw = {"align_corners": False} if mode in ("bilinear", "bicubic") else {}
    return F.interpolate(m, size=size, mode=mode, **kw)[0, 0].numpy()


def _draw_image(ax, img: np.ndarray) -> None:
    ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def patch_attention_figure(
    image,
    weights,
    patch: tuple[int, int],
    title: str = "",
    max_heads: int = 8,
    alpha: float = 0.6,
) -> Figure:
    """One layer: for each head, where the query patch ``patch = (row, col)`` looks, over the image.

    Args:
        image: (C, H, W) or (H, W), any range (min-max scaled for display).
        weights: (heads, gh, gw) attention of the query patch over the patch grid (one row of each head's map).
        patch: the query patch (outlined in cyan).
    """
    img = image_to_display(image)
    w = weights.detach().float().cpu().numpy() if isinstance(weights, torch.Tensor) else np.asarray(weights)
    if w.ndim != 3:
        raise ValueError(f"expected weights (heads, gh, gw), got {w.shape}")
    n_total = w.shape[0]
    w = w[: max(1, max_heads)]
    n_heads, gh, gw = w.shape
    h, wd = img.shape[:2]
    ncols = min(n_heads, 4)
    nrows = math.ceil(n_heads / ncols)
    side = 2.2
    fig = new_figure(figsize=(ncols * side + 0.9, nrows * (side + 0.3) + 0.6))
    axes = fig.subplots(nrows, ncols, squeeze=False,
                        gridspec_kw=dict(left=0.02, right=1 - 0.9 / (ncols * side + 0.9), bottom=0.02,
                                         top=1 - 0.6 / (nrows * (side + 0.3) + 0.6), wspace=0.08, hspace=0.25))
    vmax = float(w.max()) if w.size and w.max() > 0 else 1.0
    overlay = None
    ph, pw = h / gh, wd / gw
    for i in range(nrows * ncols):
        ax = axes[i // ncols][i % ncols]
        if i >= n_heads:
            ax.set_axis_off()
            continue
        _draw_image(ax, img)
        overlay = ax.imshow(upsample_map(w[i], (h, wd), mode="nearest"), cmap="inferno", alpha=alpha, vmin=0,
                            vmax=vmax, interpolation="nearest", extent=(-0.5, wd - 0.5, h - 0.5, -0.5))
        ax.add_patch(Rectangle((patch[1] * pw - 0.5, patch[0] * ph - 0.5), pw, ph, fill=False, edgecolor="cyan",
                               linewidth=1.5))
        ax.set_title(f"head {i}", fontsize=9)
    if overlay is not None:
        cax = fig.add_axes((1 - 0.75 / (ncols * side + 0.9), 0.06, 0.12 / (ncols * side + 0.9), 0.8))
        fig.colorbar(overlay, cax=cax, label="attention weight")
    suffix = f" (first {n_heads} of {n_total} heads)" if n_total > n_heads else ""
    fig.suptitle(f"{title}{suffix}", fontsize=9)
    return fig


def rollout_figure(image, attribution, title: str = "", alpha: float = 0.6) -> Figure:
    """The image, and the rollout's share of each patch in the prediction (gh, gw) upsampled over it."""
    img = image_to_display(image)
    a = attribution.detach().float().cpu().numpy() if isinstance(attribution, torch.Tensor) else np.asarray(attribution)
    h, w = img.shape[:2]
    fig = new_figure(figsize=(6.6, 3.4))
    ax_img, ax_map = fig.subplots(1, 2, gridspec_kw=dict(left=0.02, right=0.8, bottom=0.03, top=0.83, wspace=0.06))
    _draw_image(ax_img, img)
    ax_img.set_title("input", fontsize=9)
    _draw_image(ax_map, img)
    overlay = ax_map.imshow(upsample_map(a, (h, w), mode="bilinear"), cmap="jet", alpha=alpha,
                            extent=(-0.5, w - 0.5, h - 0.5, -0.5), interpolation="bilinear")
    ax_map.set_title("attention rollout", fontsize=9)
    cax = fig.add_axes((0.83, 0.08, 0.025, 0.7))
    fig.colorbar(overlay, cax=cax, label="share of the prediction")
    fig.suptitle(title, fontsize=9)
    return fig


def confusion_matrix_figure(cm, class_names: Sequence[str] | None = None, title: str = "") -> Figure:
    """(K, K) counts, rows = true class, columns = predicted; colour = row-normalized, numbers = counts."""
    c = cm.detach().cpu().numpy() if isinstance(cm, torch.Tensor) else np.asarray(cm)
    k = c.shape[0]
    names = [str(n) for n in class_names] if class_names is not None and len(class_names) == k else \
        [str(i) for i in range(k)]
    rows = c.sum(axis=1, keepdims=True)
    norm = np.divide(c, rows, out=np.zeros(c.shape, dtype=np.float64), where=rows > 0)
    fontsize = 8 if k <= 12 else 6
    label_in = 0.6 * fontsize / 72 * max(map(len, names))  # room for the tick labels, in inches
    panel = min(7.0, max(3.0, 0.4 * k + 1.0))
    left, bottom, right, top = 0.55 + label_in, 0.5 + label_in, 1.2, 0.45
    width, height = left + panel + right, bottom + panel + top
    fig = new_figure(figsize=(width, height))
    ax = fig.add_axes((left / width, bottom / height, panel / width, panel / height))
    image = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    if k <= 30:
        for i in range(k):
            for j in range(k):
                if c[i, j]:
                    ax.text(j, i, str(int(c[i, j])), ha="center", va="center", fontsize=fontsize,
                            color="white" if norm[i, j] > 0.5 else "black")
    ax.set_xticks(range(k), names, rotation=90 if max(map(len, names)) > 2 else 0, fontsize=fontsize)
    ax.set_yticks(range(k), names, fontsize=fontsize)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    total = c.sum()
    acc = np.trace(c) / total if total else float("nan")
    ax.set_title(f"{title}  (accuracy {acc:.3f}, n={int(total)})", fontsize=9)
    cax = fig.add_axes(((left + panel + 0.2) / width, bottom / height, 0.15 / width, panel / height))
    fig.colorbar(image, cax=cax, label="fraction of the true class")
    return fig
