"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Raw attention of one layer says where a token looks *in that layer*; with residual connections, information also
flows straight through. Rollout models that and composes the layers:

    Â_l = normalize_rows(mean_heads(A_l) + I)          (the residual path as an identity "attention")
    R   = Â_L · Â_{L-1} · … · Â_1                       (token i of the output <- token j of the input)

Each row of R sums to 1 and says how much of output token i is attributable to input token j.
For a classifier, the prediction's row is the class token's row (``pool='cls'``) or, when the prediction is the mean
of the patch outputs, the mean of the patch rows.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def attention_rollout(attentions: Sequence[Tensor], add_identity: bool = True) -> Tensor:
    """Roll out attention through the layers.

    Args:
        attentions: one tensor per layer, first layer first, each (B, H, T, T) or (H, T, T) (rows: queries).
        add_identity: add I for the residual connection before re-normalizing (the paper's recipe).
    Returns:
        (B, T, T) (or (T, T) for unbatched inputs) in float32; rows sum to 1.
    """
    if not attentions:
        raise ValueError("attention_rollout needs the attention of at least one layer")
    unbatched = attentions[0].dim() == 3
    rollout = None
    for layer, a in enumerate(attentions):
        a = a.detach().float()
        if a.dim() == 3:
            a = a.unsqueeze(0)
        if a.dim() != 4 or a.shape[-1] != a.shape[-2]:
            raise ValueError(f"layer {layer}: expected (B, H, T, T) attention, got {tuple(a.shape)}")
        a = a.mean(dim=1)  # average the heads: (B, T, T)
        if add_identity:
            a = a + torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = a / a.sum(dim=-1, keepdim=True)
        if rollout is not None and rollout.shape != a.shape:
            raise ValueError(f"layer {layer}: attention of shape {tuple(a.shape)} after {tuple(rollout.shape)}")
        rollout = a if rollout is None else a @ rollout  # later layers act on the left
    return rollout[0] if unbatched else rollout


def prediction_attribution(rollout: Tensor, pool: str = "mean", prefix: int = 0) -> Tensor:
    """The share of each patch in the prediction, (B, N) (or (N,)), from a rollout (B, T, T).

    ``pool='cls'``: the class token's row (token 0); ``'mean'``: the average of the patch rows (the prediction is
    the mean of the patch outputs). The first ``prefix`` columns (class token) are dropped and the rest
    re-normalized to sum to 1.
    """
    r = rollout if rollout.dim() == 3 else rollout.unsqueeze(0)
    if pool == "cls":
        row = r[:, 0]
    elif pool == "mean":
        row = r[:, prefix:].mean(dim=1)
    else:
        raise ValueError(f"unknown pool {pool!r}; choose 'mean' or 'cls'")
    row = row[:, prefix:]
    row = row / row.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(row.dtype).tiny)
    return row if rollout.dim() == 3 else row[0]
