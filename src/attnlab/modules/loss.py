"""Cross-entropy of a linear head without materializing the (N, V) logits (Liger-style fused linear CE).

``F.cross_entropy(h @ Wᵀ, y)`` keeps the full logits, their log-softmax and, in backward, their gradient: three
(N, V) tensors (N = B·T tokens; 4096 × 8192 fp32 = 134 MB each at the bench shape, plus an fp32 copy of bf16 logits
under autocast). Here the head runs over ``chunk`` rows at a time; each chunk's logits are turned into the loss
*and* its gradient at once (softmax − one-hot), so only one (chunk, V) block is alive. The input gradients are
computed in forward and scaled by the incoming gradient in backward: the same FLOPs as the unfused version.

Without grad (validation, generation), only the forward part runs, still chunked.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _matmul_dtype(h: Tensor) -> torch.dtype:
    dev = h.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype


class _FusedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, labels: Tensor, chunk: int, ignore_index: int, dtype) -> Tensor:
        valid = labels != ignore_index
        n_valid = valid.sum().clamp(min=1)  # stays a tensor: no host sync
        w = weight.to(dtype)
        hd = h.to(dtype)
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hd) if ctx.needs_input_grad[0] else None
        grad_w = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                  if ctx.needs_input_grad[1] else None)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for s in range(0, h.shape[0], chunk):
            hc, yc, vc = hd[s : s + chunk], labels[s : s + chunk], valid[s : s + chunk]
            logits = (hc @ w.t()).float()  # (c, V), the only block of logits alive
            lse = torch.logsumexp(logits, dim=-1)
            safe_y = yc.clamp(min=0)
            target = logits.gather(1, safe_y[:, None]).squeeze(1)
            total += ((lse - target) * vc).sum()
            if need_grad:
                g = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                g.scatter_add_(1, safe_y[:, None], -torch.ones_like(g[:, :1]))  # − one-hot
                g.mul_((vc.float() / n_valid)[:, None])  # mean over valid tokens; ignored rows get 0
                g = g.to(dtype)
                if grad_h is not None:
                    grad_h[s : s + chunk] = g @ w
                if grad_w is not None:
                    if dtype == torch.float32:
                        grad_w.addmm_(g.t(), hc)
                    else:  # the matmul in the autocast dtype (fast kernels), summed over chunks in fp32
                        grad_w.add_(g.t() @ hc)
        ctx.save_for_backward(grad_h if grad_h is not None else torch.empty(0),
                              grad_w if grad_w is not None else torch.empty(0))
        ctx.h_dtype, ctx.w_dtype = h.dtype, weight.dtype
        return total / n_valid

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        gh = (grad_h * grad_out).to(ctx.h_dtype) if ctx.needs_input_grad[0] else None
        gw = (grad_w * grad_out).to(ctx.w_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None, None


def linear_cross_entropy(h: Tensor, weight: Tensor, labels: Tensor, *, chunk: int = 1024,
                         ignore_index: int = -100) -> Tensor:
    """mean over tokens with ``labels != ignore_index`` of CE(h @ weightᵀ, labels); h (N, D), weight (V, D).

    Equal to ``F.cross_entropy(h @ weight.t(), labels, ignore_index=ignore_index)`` (fp32 softmax; under autocast
    the matmuls run in the autocast dtype, as the unfused head would).
    """
    h, labels = h.reshape(-1, h.shape[-1]), labels.reshape(-1)
    dtype = _matmul_dtype(h)
    with torch.autocast(h.device.type, enabled=False):
        return _FusedLinearCE.apply(h, weight, labels, chunk, ignore_index, dtype)
