"""Attention health: a few numbers per layer and head that say how a map looks, logged as line plots.

From one captured map (H, Tq, Tk) of the fixed sample (the attention-map callback's, no extra forward pass):

* ``entropy``: each query row's entropy divided by the log of the number of keys it may see (the keys with a
  non-zero weight: a causal row sees the past, padding gets exactly 0), averaged over queries that see more than one
  key. 1 = uniform over what it may see; 0 = one key.
* ``sink``: the mean weight on the first key (an attention sink takes most of it), over the queries after the first
  (the first query of a causal map can only see it).
* ``distance`` (self-attention): the mean attention distance, Σ_j w_ij |i − j| averaged over queries, in tokens; for
  the ViT in pixels between patch centres over the patch grid (the ViT paper's figure 7), the class token left out.
* ``focus_rate`` and ``diagonal_rate`` (cross-attention, the TTS alignment): the largest weight per query averaged
  over queries (FastSpeech's focus rate) and the share of the mass within 0.1 of the diagonal |j/Tk − i/Tq|
  (:func:`attnlab.modules.guided_attention.focus_rate` / ``diagonal_rate``), the numbers the TTS task logs for its
  whole validation set as ``val/focus_rate_tf`` / ``val/diagonal_rate_tf``, here for the sample and for every layer.

Logged as ``health.<module>/<metric>`` (the mean over heads) and ``health.<module>/<metric>_h<k>`` per head
(:func:`health_key`): W&B makes a panel section of each key's first ``/``-separated part, so every attention module
(layer) gets its own section, and ``python -m attnlab.workspace`` draws one line plot per metric in it, the heads as
lines (:func:`parse_health_key`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from ..modules.guided_attention import diagonal_rate, focus_rate

__all__ = ["head_health", "attention_health", "health_section", "health_key", "parse_health_key", "METRICS"]

PREFIX = "health"
METRICS = ("entropy", "sink", "distance", "focus_rate", "diagonal_rate")  # the order a workspace shows them in


def _entropy(w: Tensor) -> Tensor:
    """(H,) mean normalized entropy of the rows of (H, Tq, Tk)."""
    seen = (w > 0).sum(-1)  # (H, Tq)
    h = -(w * torch.log(w.clamp_min(1e-30))).sum(-1)
    ok = seen > 1
    norm = torch.where(ok, h / torch.log(seen.clamp_min(2).float()), torch.zeros_like(h))
    return norm.sum(-1) / ok.sum(-1).clamp_min(1)


def _distance(w: Tensor, grid: int | None = None, prefix: int = 0, patch_px: float = 1.0) -> Tensor:
    """(H,) mean attention distance: tokens, or pixels between patch centres on a ``grid`` × ``grid`` image."""
    if grid:
        w = w[:, prefix:, prefix:]
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)  # the patches' share, the class token left out
        idx = torch.arange(grid * grid, device=w.device)
        pos = torch.stack([idx // grid, idx % grid], -1).float() * patch_px
        d = torch.cdist(pos, pos)  # (P, P) pixels
    else:
        q, k = torch.arange(w.shape[1], device=w.device), torch.arange(w.shape[2], device=w.device)
        d = (q[:, None] - k[None, :]).abs().float()
    return (w * d).sum(-1).mean(-1)


def head_health(w: Tensor, cross: bool = False, grid: int | None = None, prefix: int = 0,
                patch_px: float = 1.0) -> dict[str, Tensor]:
    """Per-head metrics of one map (H, Tq, Tk) (module docstring): name -> (H,)."""
    w = w.detach().float()
    out = {"entropy": _entropy(w)}
    out["sink"] = w[:, 1:, 0].mean(-1) if w.shape[1] > 1 else w[:, :, 0].mean(-1)
    if cross:
        h = w.shape[0]
        tq = torch.tensor([w.shape[1]], device=w.device)
        tk = torch.tensor([w.shape[2]], device=w.device)
        out["focus_rate"] = torch.stack([focus_rate(w[i][None, None], tk, tq)[0] for i in range(h)])
        out["diagonal_rate"] = torch.stack([diagonal_rate(w[i][None, None], tk, tq)[0] for i in range(h)])
    else:
        out["distance"] = _distance(w, grid, prefix, patch_px)
    return out


def health_section(module: str) -> str:
    """``health.<module>``: the keys' part before the ``/``, the panel section W&B groups them in."""
    return f"{PREFIX}.{module}"


def health_key(module: str, metric: str, head: int | None = None) -> str:
    """``health.<module>/<metric>`` (the mean over heads) or ``health.<module>/<metric>_h<head>``."""
    return f"{health_section(module)}/{metric}" + ("" if head is None else f"_h{head}")


def parse_health_key(key: str) -> tuple[str, str, int | None] | None:
    """``(module, metric, head or None for the mean)`` of a :func:`health_key`; None for any other key."""
    section, sep, name = key.partition("/")
    if not sep or not section.startswith(PREFIX + ".") or "/" in name:
        return None
    module = section[len(PREFIX) + 1:]
    metric, _, head = name.rpartition("_h")
    if not module:
        return None
    if metric in METRICS and head.isdigit():
        return module, metric, int(head)
    return (module, name, None) if name in METRICS else None


def attention_health(maps: Mapping[str, Tensor], grid: int | None = None, prefix: int = 0,
                     patch_px: float = 1.0) -> dict[str, float]:
    """``{health.<module>/<metric>[_h<k>]: value}`` for every captured map (module name -> (B, H, Tq, Tk), the first
    sample is used). ``grid``/``prefix``/``patch_px``: the ViT's patch grid, class tokens and patch size in pixels
    (distances in pixels)."""
    out: dict[str, float] = {}
    for name, w in maps.items():
        metrics = head_health(w[0], cross="cross" in name, grid=grid, prefix=prefix, patch_px=patch_px)
        for metric, per_head in metrics.items():
            values = [float(v) for v in per_head]
            if not all(math.isfinite(v) for v in values):
                continue
            out[health_key(name, metric)] = sum(values) / len(values)
            out.update({health_key(name, metric, k): v for k, v in enumerate(values)})
    return out
