"""Normalization layers (seed claims C13, C14, C19).

The layer is the ``norm`` config group's ``layer`` (conf/norm/*.yaml: ``torch.nn.LayerNorm``, ``torch.nn.RMSNorm``,
or :class:`SequenceBatchNorm` here); *where* it goes (before the sublayer = pre-norm, after the residual =
post-norm) is the group's ``placement``, applied by the block (see :mod:`attnlab.modules.block`).

* LayerNorm: normalize each token over its features, re-center and rescale (learned gain and bias).
* RMSNorm (Zhang & Sennrich 2019): only rescale by the root mean square, no mean, no bias: cheaper (claim E9).
* BatchNorm (Ioffe & Szegedy 2015): normalize each *feature* over the batch and the time positions, with running
  statistics for evaluation; the seeds' C19 says it does worse than LayerNorm in transformers (claim E12).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

class SequenceBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the feature dimension of a (..., D) stream: statistics across every batch row and position.

    Training normalizes with the current batch's per-feature mean and (biased) variance and updates the running
    statistics (momentum 0.1, unbiased variance, as ``nn.BatchNorm1d``); evaluation uses the running statistics, so
    a token's output then depends on that token alone (incremental decoding with a KV cache stays consistent).

    Padding: called with ``padding_mask`` (B, T), True = real token, the batch statistics (and the running ones)
    are computed over the real tokens only, and padded positions are normalized with those same statistics (their
    outputs are never attended to nor scored). Without a mask (a causal LM has no padding; the models' final norm
    after a pre-norm stack is called without one) every position counts, pads included. In evaluation the mask
    changes nothing.

    Two properties that make it a poor fit for sequence models, by design not fixed here: in training a token's
    output depends on the other sequences of the batch and on *later* positions of its own sequence (for a causal
    LM a faint leak of the future through the batch mean and variance, gone in evaluation), and training and
    evaluation normalize differently. Under DDP each process uses its own shard's statistics; do not convert it
    with ``SyncBatchNorm`` (that expects channels in dimension 1).
    """

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (B·T, D): every position is one sample of each feature
        if padding_mask is None or not self.training:
            return super().forward(flat).view_as(x)
        keep = padding_mask.reshape(-1)
        if keep.shape[0] != flat.shape[0]:
            raise ValueError(f"padding_mask of shape {tuple(padding_mask.shape)} does not match input {tuple(x.shape)}")
        real = flat[keep]
        if real.shape[0] < 2:  # nothing (or one token) to take statistics over: use every position
            return super().forward(flat).view_as(x)
        mean, var = real.mean(0), real.var(0, unbiased=False)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                n = real.shape[0]
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), momentum)
                self.running_var.lerp_((var.detach() * n / (n - 1)).to(self.running_var.dtype), momentum)
        y = (flat - mean) * torch.rsqrt(var + self.eps)
        if self.affine:
            y = y * self.weight + self.bias
        return y.view_as(x)


def apply_norm(norm: nn.Module, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
    """``norm(x)``, handing the padding mask (True = real token) to the norms whose statistics cross tokens."""
    if padding_mask is not None and isinstance(norm, SequenceBatchNorm):
        return norm(x, padding_mask)
    return norm(x)
