"""Figures of the text-to-speech model: mel spectrograms (target / teacher-forced / free-running) and alignments."""

from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure

from .figures import _to_numpy, new_figure


def mel_figure(mels: Sequence, titles: Sequence[str], title: str = "") -> Figure:
    """One panel per (frames, n_mels) spectrogram, frequency upwards, on a shared colour scale."""
    arrays = [_to_numpy(m) for m in mels]
    vmin = min(float(a.min()) for a in arrays if a.size)
    vmax = max(float(a.max()) for a in arrays if a.size)
    height = 2.2 * len(arrays) + 1.2
    fig = new_figure(figsize=(10, height))
    axes = fig.subplots(len(arrays), 1, squeeze=False,
                        gridspec_kw={"hspace": 0.5, "top": 1 - 0.7 / height, "bottom": 0.5 / height})[:, 0]
    for ax, a, t in zip(axes, arrays, titles):
        im = ax.imshow(a.T, origin="lower", aspect="auto", interpolation="nearest", vmin=vmin, vmax=vmax,
                       cmap="magma")
        ax.set_title(t, fontsize=9)
        ax.set_ylabel("mel bin", fontsize=8)
    axes[-1].set_xlabel("frame", fontsize=8)
    fig.colorbar(im, ax=list(axes), label="normalized log-mel")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def alignment_figure(attention, text: str | Sequence[str], title: str = "") -> Figure:
    """(steps, N) attention (heads averaged): characters on the x axis, decoder steps upwards; ``text``: one label
    per column (a string's characters, or a list such as the characters and ``<eos>``)."""
    a = _to_numpy(attention)
    fig = new_figure(figsize=(max(4.0, 0.16 * a.shape[1] + 1.5), max(3.0, 0.05 * a.shape[0] + 1.5)))
    ax = fig.subplots()
    im = ax.imshow(a, origin="lower", aspect="auto", interpolation="nearest", cmap="viridis", vmin=0)
    if len(text) == a.shape[1] and a.shape[1] <= 80:
        ax.set_xticks(range(len(text)), [c if c != " " else "␣" for c in text], fontsize=7)
    ax.set_xlabel("input character", fontsize=8)
    ax.set_ylabel("decoder step", fontsize=8)
    fig.colorbar(im, ax=ax, label="attention")
    if title:
        ax.set_title(title, fontsize=9)
    return fig
