"""Normalization layers (seed claims C13, C14, C19).

The layer is the ``norm`` config group's ``layer`` (conf/norm/*.yaml: ``torch.nn.LayerNorm``, :class:`RMSNorm` or
:class:`SequenceBatchNorm` here); *where* it goes (before the sublayer = pre-norm, after the residual =
post-norm) is the group's ``placement``, applied by the block (see :mod:`attnlab.modules.block`).

* LayerNorm: normalize each token over its features, re-center and rescale (learned gain and bias).
* RMSNorm (Zhang & Sennrich 2019): only rescale by the root mean square, no mean, no bias: cheaper (claim E9).
  :class:`RMSNorm` is ``torch.nn.RMSNorm`` with a faster CPU path (why: see the class).
* BatchNorm (Ioffe & Szegedy 2015): normalize each *feature* over the batch and the time positions, with running
  statistics for evaluation; the seeds' C19 says it does worse than LayerNorm in transformers (claim E12).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _rstd(x: Tensor, eps: float) -> Tensor:
    """1 / sqrt(mean(x²) + eps) over the last dimension, (..., 1). ||x||² / D: one reduction kernel (vector_norm)
    where x.pow(2).mean() is a pass that writes x² first."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()


class _RMSNormFunction(torch.autograd.Function):
    """y = x̂ · w with x̂ = x · rstd, rstd = 1 / sqrt(mean(x²) + eps) over the last dimension; the backward written out:
    g = dy · w, dx = rstd · (g − x̂ · mean(g · x̂)), dw = Σ_rows dy · x̂. Saves x̂ and rstd (the same memory as
    autograd's x and rstd)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        rstd = _rstd(x, eps)
        xhat = x * rstd
        ctx.save_for_backward(xhat, rstd, weight)
        return xhat * weight

    @staticmethod
    def backward(ctx, dy: Tensor):
        xhat, rstd, weight = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[0]:
            g = dy * weight
            dot = (g * xhat).mean(dim=-1, keepdim=True)  # (..., 1)
            dx = torch.addcmul(g, xhat, dot, value=-1).mul_(rstd)
        if ctx.needs_input_grad[1]:
            dw = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(dim=0)
        return dx, dw, None


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` (the same parameters, state dict and results, to float rounding) with a faster path for
    fp32/fp64 tensors on CPU without autocast.

    Why: on CPU, torch's RMSNorm is a composite of about ten elementwise kernels forward and backward (each a pass
    over memory), while LayerNorm is one fused native kernel, so eager RMSNorm came out 4-6× *slower* than LayerNorm
    (``python -m bench --only P9``), the opposite of the claim (E9). This path uses three passes forward and a
    hand-written backward: about 2× faster than torch's, still behind LayerNorm's fused kernel. On GPU, under
    autocast, under ``torch.compile`` (which fuses torch's decomposition itself) and for other shapes or dtypes it
    is torch's forward, unchanged.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not self._fast_path(x):
            return super().forward(x)
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return _RMSNormFunction.apply(x, self.weight, eps)
        return (x * _rstd(x, eps)).mul_(self.weight)  # inference: no autograd, one new tensor

    def _fast_path(self, x: Tensor) -> bool:
        return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and self.weight is not None
                and self.weight.dtype == x.dtype and len(self.normalized_shape) == 1
                and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())


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
