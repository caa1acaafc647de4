"""Normalization layers (seed claims C13, C14, C19).

The layer kind lives here; *where* it goes (before the sublayer = pre-norm, after the residual = post-norm) is the
block's choice (see :mod:`attnlab.modules.block`).

* LayerNorm: normalize each token over its features, re-center and rescale (learned gain and bias).
* RMSNorm (Zhang & Sennrich 2019): only rescale by the root mean square, no mean, no bias: cheaper (claim E9).
"""

from __future__ import annotations

from torch import nn

NORM_KINDS = ("layernorm", "rmsnorm")


def build_norm(kind: str, dim: int, eps: float = 1e-5) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown norm kind {kind!r}; choose one of {', '.join(NORM_KINDS)}")
