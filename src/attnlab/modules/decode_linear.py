"""Linear maps during incremental decoding: the weight read from a contiguous (in, out) copy.

A decoding step multiplies a few rows (batch × beam, one token each) by every weight matrix. On CPU, torch's
small-M product with an ``nn.Linear`` weight as stored, (out, in), ran slower here than the same product with the
weight laid out (in, out): summed over the P4 model's matrices, 16 % less time at 1 row and 35 % at 8 in a matmul
microbenchmark (Xeon with AMX, one thread); bench P4 times the floor both ways. So inside :func:`decoding` (what the
steppers wrap their prefill and steps in), :func:`linear` multiplies by a transposed copy of the weight, made once and
kept until the weight changes; the parameters, the state dict and training are untouched. End to end it is a few
per cent of a greedy generation (2-5 %, session 7): the rest of a step (norms, GELU, attention, Python) dominates.

The copy is found by the parameter (a weak reference: it goes when the parameter goes) and checked against the
parameter's version counter and storage, so an optimizer step, ``load_state_dict`` or ``.to()`` between two
generations gives a fresh copy. (An in-place write through ``param.data`` bypasses the version counter; nothing here
writes parameters that way.) It costs one more copy of every linear weight a decoder reads, in memory.

Same function, not the same bits: the two layouts run different matmul kernels, whose sums differ in the last float
bits (as a cached step already differs from the full forward); the tests compare against the full forward.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.utils.weak import WeakIdKeyDictionary

# above this many rows the two layouts ran the same kernel here (identical results): nothing to gain
DECODE_ROWS = 64

_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("attnlab_decoding", default=False)
_TRANSPOSED = WeakIdKeyDictionary()  # weight (by identity) -> ((version, data_ptr), its (in, out) copy)


@contextmanager
def decoding() -> Iterator[None]:
    """Inside this block, :func:`linear` on a few rows without autograd uses the (in, out) weight copies."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def transposed_weight(weight: Tensor) -> Tensor:
    """A contiguous ``weight.t()``, cached per parameter until the parameter is written or moved."""
    key = (weight._version, weight.data_ptr())
    hit = _TRANSPOSED.get(weight)
    if hit is not None and hit[0] == key:
        return hit[1]
    wt = weight.detach().t().contiguous()
    _TRANSPOSED[weight] = (key, wt)
    return wt


def linear(layer: nn.Linear, x: Tensor) -> Tensor:
    """``layer(x)``; inside :func:`decoding`, for at most ``DECODE_ROWS`` rows on CPU without autograd or autocast, the
    same product from the transposed weight copy. Any other module, or one with hooks, is simply called."""
    if (not _ACTIVE.get() or type(layer) is not nn.Linear or layer._forward_hooks or layer._forward_pre_hooks
            or _module._global_forward_hooks or _module._global_forward_pre_hooks
            or x.device.type != "cpu" or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu")
            or x.numel() > DECODE_ROWS * x.shape[-1]):
        return layer(x)
    wt = transposed_weight(layer.weight)
    flat = x.reshape(-1, x.shape[-1])
    out = flat @ wt if layer.bias is None else torch.addmm(layer.bias, flat, wt)
    return out.view(*x.shape[:-1], wt.shape[1])
