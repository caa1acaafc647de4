"""One multi-head attention module for self- and cross-attention (seed claims C4, C5, C6, C7, C22).

Two paths compute the same function:

* the fast path, ``F.scaled_dot_product_attention`` (fused kernels; memory O(N) in sequence length), used for
  every training and inference step by default;
* the explicit path, ``softmax(QKᵀ/√d + mask) V`` written out, which also returns the attention weights. It runs
  only when weights are asked for: by a caller whose loss needs them (guided attention, copy mechanism), or
  inside :func:`capture_attention` (the attention-map callback, one forward pass on its logging step).

Mask convention everywhere in this package: boolean, ``True`` = may attend / is a real token.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class KVCache:
    """Keys and values of one attention layer, kept across incremental decoding steps.

    Pre-allocated to ``max_len`` so that appending is an in-place copy, not a concatenation per step.
    For cross-attention the encoder's projected keys/values are stored once and reused (``static``).
    """

    def __init__(self, batch: int, n_heads: int, head_dim: int, max_len: int, *, dtype=None, device=None):
        shape = (batch, n_heads, max_len, head_dim)
        # empty, not zeros: only the first `length` positions are ever read, so zero-filling max_len positions
        # per layer at every prefill was pure memory traffic (the fill_ in the generation profile)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, H, t, Dh) after the cached ones; return all keys and values so far."""
        t = k.shape[2]
        if self.length + t > self.max_len:
            raise ValueError(f"KV cache full: {self.length} + {t} positions > max_len {self.max_len}")
        if k.dtype != self.k.dtype:  # the first write decides the dtype (e.g. bf16 under autocast)
            self.k, self.v = self.k.to(k.dtype), self.v.to(v.dtype)
        self.k[:, :, self.length : self.length + t] = k
        self.v[:, :, self.length : self.length + t] = v
        self.length += t
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search: keep the surviving hypotheses' histories).

        Only the filled positions are copied (a beam step used to copy all ``max_len`` of them per layer).
        """
        self.k, self.v = self._select(self.k, index), self._select(self.v, index)

    def _select(self, buf: Tensor, index: Tensor) -> Tensor:
        out = buf.new_empty((index.shape[0], *buf.shape[1:]))
        out[:, :, : self.length] = buf[:, :, : self.length].index_select(0, index)
        return out


def causal_mask(q_len: int, k_len: int, device=None) -> Tensor:
    """(q_len, k_len) boolean mask, True on and below the diagonal aligned to the *last* key.

    With a KV cache the queries are the last ``q_len`` of ``k_len`` positions, so query i sits at absolute
    position ``k_len - q_len + i`` and may see keys up to there (SDPA's own ``is_causal`` aligns top-left).
    """
    q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    k_pos = torch.arange(k_len, device=device)[None, :]
    return k_pos <= q_pos


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention.

    Args:
        d_model: width of the queries' stream (and of the output).
        n_heads: heads; each works in a d_model / n_heads subspace, outputs are concatenated then projected (C7).
        kv_dim: width of the keys/values' source for cross-attention (None: self-attention, fused QKV matmul).
        dropout: dropout on the attention weights (training only).
        bias: biases in the projections.
        scaled: divide scores by √d_head (C4). ``False`` reproduces claim E3's unscaled dot products.
        rotary: a :class:`~attnlab.modules.positional.RotaryEmbedding` applied to q and k (self-attention only).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        kv_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        scaled: bool = True,
        rotary: nn.Module | None = None,
    ):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.is_cross = kv_dim is not None
        if self.is_cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(kv_dim, 2 * d_model, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout
        self.scale = 1.0 / math.sqrt(self.head_dim) if scaled else 1.0
        self.rotary = rotary
        # When True, forward takes the explicit path and keeps the weights in `self.weights` (B, H, Tq, Tk).
        self.return_weights = False
        self.weights: Tensor | None = None

    def _heads(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, H, T, Dh)
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        kv_cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """
        Args:
            x: (B, Tq, D) queries' stream.
            context: (B, Tk, kv_dim) keys/values' source, required for cross-attention.
            attn_mask: bool, broadcastable to (B, H, Tq, Tk); True = may attend.
            key_padding_mask: (B, Tk) bool; True = real token, False = padding (gets no weight).
            is_causal: position t attends to positions <= t only (C6).
            kv_cache: incremental decoding; self-attention appends this step's k, v; cross-attention fills
                the cache from `context` on the first call and reuses it afterwards (context may then be None).
            need_weights: take the explicit path and keep the weights in ``self.weights``.
        Returns:
            (B, Tq, D)
        """
        b, tq, _ = x.shape
        if self.is_cross:
            q = self._heads(self.q_proj(x))
            if kv_cache is not None and kv_cache.length > 0:
                k, v = kv_cache.k[:, :, : kv_cache.length], kv_cache.v[:, :, : kv_cache.length]
            else:
                if context is None:
                    raise ValueError("cross-attention needs `context` (or a filled kv_cache)")
                k, v = (self._heads(t) for t in self.kv_proj(context).chunk(2, dim=-1))
                if kv_cache is not None:
                    k, v = kv_cache.append(k, v)
        else:
            q, k, v = (self._heads(t) for t in self.qkv_proj(x).chunk(3, dim=-1))
            offset = kv_cache.length if kv_cache is not None else 0
            if self.rotary is not None:
                q, k = self.rotary(q, k, offset=offset)
            if kv_cache is not None:
                k, v = kv_cache.append(k, v)

        mask = self._merge_masks(attn_mask, key_padding_mask, is_causal, tq, k.shape[2], x.device)
        # SDPA's is_causal is top-left aligned, so it is only used when no cache shifts the queries.
        sdpa_causal = is_causal and mask is None and tq == k.shape[2]
        if is_causal and not sdpa_causal and mask is None and tq > 1:
            mask = causal_mask(tq, k.shape[2], x.device)

        if need_weights or self.return_weights:
            out, w = self._explicit(q, k, v, mask, sdpa_causal)
            self.weights = w
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=sdpa_causal,
                dropout_p=self.dropout if self.training else 0.0, scale=self.scale,
            )
        out = out.transpose(1, 2).reshape(b, tq, self.d_model)  # concatenate heads
        return self.out_proj(out)

    @staticmethod
    def _merge_masks(attn_mask, key_padding_mask, is_causal, tq, tk, device) -> Tensor | None:
        mask = attn_mask
        if key_padding_mask is not None:
            kp = key_padding_mask[:, None, None, :]  # (B, 1, 1, Tk)
            mask = kp if mask is None else mask & kp
        if is_causal and mask is not None:
            mask = mask & causal_mask(tq, tk, device)
        return mask

    def _explicit(self, q, k, v, mask, causal) -> tuple[Tensor, Tensor]:
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, Tq, Tk)
        if causal:
            mask = causal_mask(q.shape[2], k.shape[2], q.device)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        # A query row with every key masked would be softmax(-inf…) = NaN; SDPA returns zeros there, so do we.
        weights = scores.float().softmax(dim=-1).nan_to_num(0.0).to(q.dtype)
        dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
        return dropped @ v, weights


class AttentionMaps(dict):
    """name of attention module -> weights (B, H, Tq, Tk), detached, filled by :func:`capture_attention`."""


def is_attention_module(m: nn.Module) -> bool:
    """A module whose weights :func:`capture_attention` can collect."""
    return isinstance(m, MultiHeadAttention) or (hasattr(m, "return_weights") and hasattr(m, "weights"))


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[AttentionMaps]:
    """Turn on weights for every attention module of ``model`` for the forward passes inside the block.

    Only the attention-map callback and analysis code use this; training steps never do, so they keep the fused
    path. The yielded dict is filled when the block exits, keyed by module name (e.g. ``blocks.0.self_attn``).

    Besides :class:`MultiHeadAttention`, any module with the same two attributes takes part (duck typing):
    ``return_weights`` (bool, set True here) and ``weights`` (set to None here; the module stores its last
    weights there as (B, H, Tq, Tk), e.g. an RNN's additive attention concatenating its per-step rows).
    """
    modules = {n: m for n, m in model.named_modules() if is_attention_module(m)}
    previous = {n: m.return_weights for n, m in modules.items()}
    maps = AttentionMaps()
    for m in modules.values():
        m.return_weights, m.weights = True, None
    try:
        yield maps
    finally:
        for n, m in modules.items():
            if m.weights is not None:
                maps[n] = m.weights.detach()
            m.return_weights = previous[n]
            if not previous[n]:
                m.weights = None
