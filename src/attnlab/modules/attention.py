"""One multi-head attention module for self- and cross-attention (seed claims C4, C5, C6, C7, C22).

Two paths compute the same function:

* the fast path, ``F.scaled_dot_product_attention`` (fused kernels; memory O(N) in sequence length), used for
  every training and inference step by default;
* the explicit path, ``softmax(QKᵀ/√d + mask) V`` written out, which also returns the attention weights. It runs
  only when weights are asked for: by a caller whose loss needs them (guided attention, copy mechanism), or
  inside :func:`capture_attention` (the attention-map callback, one forward pass on its logging step).

Variants: grouped-query attention (``kv_heads`` < ``n_heads``; ``kv_heads=1`` is multi-query), QK-norm
(RMSNorm over the head dimension of q and k), a sliding window (``window``), and attention-side positions
(``positions``: RoPE rotates q and k, ALiBi adds a bias to the scores). All of them stay on the fused path: GQA
through SDPA's ``enable_gqa``, the window as a boolean mask and a position bias as a float mask passed to SDPA.

Mask convention everywhere in this package: boolean, ``True`` = may attend / is a real token.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import ConfigError
from .norm import RMSNorm
from .positional import AttentionPositions
from .settings import AttentionSettings


class KVCache:
    """Keys and values of one attention layer, kept across incremental decoding steps.

    Pre-allocated so that appending is an in-place copy, not a concatenation per step.
    For cross-attention the encoder's projected keys/values are stored once and reused (``static``).

    ``length`` is always the number of positions seen so far, i.e. the absolute position of the next token (the
    models use it as their position offset). With ``window`` (a sliding-window layer) the cache keeps only the last
    ``min(window, max_len)`` positions, in a ring buffer: position p lives in slot ``p % capacity``, and it never
    fills up (``length`` keeps counting past the capacity).
    """

    def __init__(self, batch: int, n_heads: int, head_dim: int, max_len: int, *, window: int | None = None,
                 dtype=None, device=None):
        # a window at least as long as the cache never hides a cached key: that is a plain cache
        self.window = window if window is not None and window < max_len else None
        shape = (batch, n_heads, max_len if self.window is None else self.window, head_dim)
        # empty, not zeros: only the first `length` positions are ever read, so zero-filling max_len positions
        # per layer at every prefill would be pure memory traffic (the fill_ it costs shows in the generation profile)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0
        # absolute positions of the keys the last `append` returned when they are not in order (a wrapped ring,
        # one new token: slot order), else None (in order, ending at `length`)
        self.key_order: Tensor | None = None
        self._spare_k: Tensor | None = None  # the buffers :meth:`reorder` copies into next (double buffering)
        self._spare_v: Tensor | None = None

    @property
    def max_len(self) -> int:
        """Positions the buffer holds (for a windowed cache: the window)."""
        return self.k.shape[2]

    @property
    def stored(self) -> int:
        """Positions held now: ``length`` for a plain cache, at most the window for a windowed one."""
        return min(self.length, self.max_len)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, H, t, Dh) after the cached ones; return the keys and values the t new queries may attend
        to: all so far for a plain cache; for a windowed one at least the last ``window - 1`` positions before the
        new ones, and the new ones (the attention's window mask hides any older key)."""
        t = k.shape[2]
        if k.dtype != self.k.dtype:  # the first write decides the dtype (e.g. bf16 under autocast)
            self.k, self.v = self.k.to(k.dtype), self.v.to(v.dtype)
        start, cap = self.length, self.max_len
        self.key_order = None
        if start + t <= cap:  # not wrapped yet: in order, like a plain cache
            self.k[:, :, start : start + t] = k
            self.v[:, :, start : start + t] = v
            self.length += t
            return self.k[:, :, : self.length], self.v[:, :, : self.length]
        if self.window is None:
            raise ValueError(f"KV cache full: {self.length} + {t} positions > max_len {self.max_len}")
        first = start + t - cap  # the oldest position kept after this call
        if t == 1:
            # one query: the slot it overwrites holds position start - cap, the one key just outside its window;
            # so write in place and attend to the whole ring (keys in slot order, their positions in key_order)
            self.k[:, :, start % cap] = k[:, :, 0]
            self.v[:, :, start % cap] = v[:, :, 0]
            self.length += 1
            self.key_order = first + (torch.arange(cap, device=self.k.device) - first) % cap  # slot s holds this
            return self.k, self.v
        # a chunk (prefill longer than the window, or any t > 1 after wrapping): its first queries still need keys
        # the chunk would overwrite, so attend to [cached in order, new] and store the last `cap` afterwards
        held = self.stored
        old = torch.arange(start - held, start, device=self.k.device) % cap
        keys = torch.cat([self.k.index_select(2, old), k], dim=2)
        values = torch.cat([self.v.index_select(2, old), v], dim=2)
        slots = torch.arange(first, start + t, device=self.k.device) % cap
        self.k.index_copy_(2, slots, keys[:, :, -cap:])
        self.v.index_copy_(2, slots, values[:, :, -cap:])
        self.length += t
        return keys, values

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search: keep the surviving hypotheses' histories).

        Only the filled positions are copied (not all ``max_len`` of them per layer), into a
        second buffer kept from the previous reorder: a fresh multi-MB buffer per layer per step cost more in page
        faults than the copy itself (beam search, bench P6). Views of the cache taken before a reorder are
        therefore overwritten by the one after.
        """
        self.k, self._spare_k = self._select(self.k, index, self._spare_k)
        self.v, self._spare_v = self._select(self.v, index, self._spare_v)

    def _select(self, buf: Tensor, index: Tensor, spare: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """(the rows ``index`` of ``buf`` in ``spare`` or a new buffer, ``buf`` as the next spare)."""
        n, held = index.shape[0], self.stored
        if buf.requires_grad:  # autograd through a cache (no decoding loop does): the differentiable copy
            out = buf.new_empty((n, *buf.shape[1:]))
            out[:, :, :held] = buf[:, :, :held].index_select(0, index)
            return out, None
        if spare is None or spare.shape[0] < n or spare.shape[1:] != buf.shape[1:] or spare.dtype != buf.dtype:
            spare = buf.new_empty((n, *buf.shape[1:]))
        out = spare[:n]
        torch.index_select(buf[:, :, :held], 0, index, out=out[:, :, :held])
        return out, buf


def causal_mask(q_len: int, k_len: int, device=None) -> Tensor:
    """(q_len, k_len) boolean mask, True on and below the diagonal aligned to the *last* key.

    With a KV cache the queries are the last ``q_len`` of ``k_len`` positions, so query i sits at absolute
    position ``k_len - q_len + i`` and may see keys up to there (SDPA's own ``is_causal`` aligns top-left).
    """
    q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    k_pos = torch.arange(k_len, device=device)[None, :]
    return k_pos <= q_pos


def window_mask(q_pos: Tensor, k_pos: Tensor, window: int, causal: bool) -> Tensor:
    """(Tq, Tk) boolean: True where key position j is within the window of query position i: ``i - W < j``
    (causal; the causal mask adds ``j <= i``), or ``|i - j| < W`` (non-causal: encoders, ViT)."""
    d = q_pos[:, None] - k_pos[None, :]
    return d < window if causal else d.abs() < window


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention.

    Args:
        d_model: width of the queries' stream (and of the output).
        n_heads: query heads; each works in a d_model / n_heads subspace, outputs are concatenated then projected (C7).
        kv_heads: key/value heads (None: n_heads). Fewer is grouped-query attention: query head h reads key/value
            head ``h // (n_heads / kv_heads)``; 1 is multi-query attention. The KV cache shrinks by n_heads/kv_heads.
        kv_dim: width of the keys/values' source for cross-attention (None: self-attention, fused QKV matmul).
        dropout: dropout on the attention weights (training only).
        bias: biases in the projections.
        scaled: divide scores by √d_head (C4). ``False`` reproduces claim E3's unscaled dot products.
        qk_norm: RMSNorm over the head dimension of q and of k (learned gain per channel, shared by the heads),
            applied after the projection and before positions (OLMo-2, Gemma, Qwen3): modules ``q_norm``/``k_norm``.
        qk_norm_eps: their epsilon; None: torch's default for the dtype (1.2e-7 in fp32). Qwen3 uses its
            ``rms_norm_eps`` here too.
        window: sliding-window attention: causal, query i sees keys j with i - W < j <= i; non-causal
            |i - j| < W. Self-attention only. A windowed layer's :meth:`new_cache` keeps W positions.
        positions: an :class:`~attnlab.modules.positional.AttentionPositions` (RoPE, ALiBi), self-attention only.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        kv_heads: int | None = None,
        kv_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        scaled: bool = True,
        qk_norm: bool = False,
        qk_norm_eps: float | None = None,
        window: int | None = None,
        positions: AttentionPositions | None = None,
    ):
        super().__init__()
        # the attn group's values and their relation to the sizes: the same check and line as train.py's
        settings = AttentionSettings(kv_heads=kv_heads, qk_norm=qk_norm, qk_norm_eps=qk_norm_eps, window=window,
                                     scaled=scaled)
        head_dim = settings.check_sizes(d_model, n_heads)
        kv_heads = n_heads if kv_heads is None else kv_heads
        if window is not None and kv_dim is not None:
            raise ConfigError(f"attn.window={window} applies to self-attention only; cross-attention sees the whole "
                              f"source (build cross-attention with window=None)")
        if getattr(positions, "n_heads", n_heads) != n_heads:
            raise ValueError(f"{type(positions).__name__} was built for {positions.n_heads} heads, "
                             f"this attention has n_heads={n_heads}")
        if positions is not None and kv_dim is not None:
            raise ValueError("attention-side positions (rotary, ALiBi) apply to self-attention only")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.kv_heads, self.window = kv_heads, window
        kv_width = kv_heads * self.head_dim
        self.is_cross = kv_dim is not None
        # With kv_heads == n_heads these are plain multi-head attention's layers (names, shapes, q|k|v order): the
        # state-dict layout that every saved checkpoint of a multi-head model holds.
        if self.is_cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(kv_dim, 2 * kv_width, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, d_model + 2 * kv_width, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        if qk_norm:
            self.q_norm, self.k_norm = RMSNorm(self.head_dim, eps=qk_norm_eps), RMSNorm(self.head_dim, eps=qk_norm_eps)
        self.qk_norm = qk_norm
        self.dropout = dropout
        self.scale = 1.0 / math.sqrt(self.head_dim) if scaled else 1.0
        self.positions = positions
        # When True, forward takes the explicit path and keeps the weights in `self.weights` (B, H, Tq, Tk).
        self.return_weights = False
        self.weights: Tensor | None = None

    def new_cache(self, batch: int, max_len: int, *, dtype=None, device=None) -> KVCache:
        """An empty KV cache for this layer: ``kv_heads`` heads; a windowed layer's holds min(max_len, window)
        positions. For cross-attention ``max_len`` is the source length (filled once from the encoder)."""
        if device is None or dtype is None:
            w = self.out_proj.weight
            device, dtype = device or w.device, dtype or w.dtype
        return KVCache(batch, self.kv_heads, self.head_dim, max_len, window=self.window, dtype=dtype, device=device)

    def _heads(self, x: Tensor, n: int | None = None) -> Tensor:  # (B, T, n·Dh) -> (B, n, T, Dh)
        b, t, _ = x.shape
        return x.view(b, t, n or self.n_heads, self.head_dim).transpose(1, 2)

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
            key_padding_mask: (B, Tk) bool; True = real token, False = padding (gets no weight). With a
                self-attention cache, Tk covers every position so far (0 .. cache.length - 1).
            is_causal: position t attends to positions <= t only (C6).
            kv_cache: incremental decoding; self-attention appends this step's k, v; cross-attention fills
                the cache from `context` on the first call and reuses it afterwards (context may then be None).
            need_weights: take the explicit path and keep the weights in ``self.weights``.
        Returns:
            (B, Tq, D)
        """
        b, tq, _ = x.shape
        key_order = None  # the keys' absolute positions when not 0..Tk-1 in order (a wrapped windowed cache)
        if self.is_cross:
            q = self._heads(self.q_proj(x))
            if self.qk_norm:
                q = self.q_norm(q)
            if kv_cache is not None and kv_cache.length > 0:
                k, v = kv_cache.k[:, :, : kv_cache.length], kv_cache.v[:, :, : kv_cache.length]
            else:
                if context is None:
                    raise ValueError("cross-attention needs `context` (or a filled kv_cache)")
                k, v = (self._heads(t, self.kv_heads) for t in self.kv_proj(context).chunk(2, dim=-1))
                if self.qk_norm:
                    k = self.k_norm(k)
                if kv_cache is not None:
                    k, v = kv_cache.append(k, v)
            end = k.shape[2]
        else:
            kv_width = self.kv_heads * self.head_dim
            q, k, v = self.qkv_proj(x).split((self.d_model, kv_width, kv_width), dim=-1)
            q, k, v = self._heads(q), self._heads(k, self.kv_heads), self._heads(v, self.kv_heads)
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            offset = kv_cache.length if kv_cache is not None else 0
            if self.positions is not None:
                q, k = self.positions.rotate(q, k, offset)
            if kv_cache is not None:
                k, v = kv_cache.append(k, v)
                key_order = kv_cache.key_order
            end = offset + tq  # absolute position after the last query (= after the last key)
        tk = k.shape[2]

        mask, sdpa_causal = self._mask(attn_mask, key_padding_mask, is_causal, tq, tk, end, key_order, q)

        if need_weights or self.return_weights:
            out, w = self._explicit(q, k, v, mask, sdpa_causal)
            self.weights = w
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=sdpa_causal,
                dropout_p=self.dropout if self.training else 0.0, scale=self.scale,
                enable_gqa=self.kv_heads != self.n_heads,
            )
        out = out.transpose(1, 2).reshape(b, tq, self.d_model)  # concatenate heads
        return self.out_proj(out)

    def _mask(self, attn_mask, key_padding_mask, is_causal, tq, tk, end, key_order, q) -> tuple[Tensor | None, bool]:
        """One mask for SDPA (bool, or float when positions add a score bias) and whether SDPA's own ``is_causal``
        can stand in for the causal mask. Keys are the last Tk absolute positions before ``end`` (in the order
        ``key_order`` when given), queries the last Tq of them (self-attention; cross-attention: as today)."""
        device = q.device
        bias = None
        need_window = self.window is not None and tk > self.window  # else every key is within the window anyway
        # only a positions part that overrides score_bias (ALiBi, not RoPE) needs the positions at every step
        need_bias = self.positions is not None and type(self.positions).score_bias is not AttentionPositions.score_bias
        k_pos = q_pos = None
        held_fewer = key_order is not None or end > tk  # a windowed cache no longer holds every position
        if held_fewer or need_window or need_bias:
            k_pos = key_order if key_order is not None else torch.arange(end - tk, end, device=device)
            q_pos = torch.arange(end - tq, end, device=device)
        if need_bias:
            # (1, H, Tq, Tk): SDPA on CPU sends a 3-D float mask to its O(N²) math kernel, a 4-D one to flash
            bias = self.positions.score_bias(q_pos, k_pos, dtype=q.dtype)[None]
        if held_fewer:  # masks given over every position so far: keep the columns of the keys still held
            attn_mask = self._held_columns(attn_mask, k_pos, end, "attn_mask")
            key_padding_mask = self._held_columns(key_padding_mask, k_pos, end, "key_padding_mask")
        mask = attn_mask
        if key_padding_mask is not None:
            kp = key_padding_mask[:, None, None, :]  # (B, 1, 1, Tk)
            mask = kp if mask is None else mask & kp
        if need_window:
            wm = window_mask(q_pos, k_pos, self.window, is_causal)
            mask = wm if mask is None else mask & wm
        # SDPA's is_causal is top-left aligned, so it is only used when no cache shifts the queries.
        sdpa_causal = is_causal and mask is None and bias is None and tq == tk
        if is_causal and not sdpa_causal and tq > 1:
            cm = (k_pos[None, :] <= q_pos[:, None]) if k_pos is not None else causal_mask(tq, tk, device)
            mask = cm if mask is None else mask & cm
        if bias is not None:
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        return mask, sdpa_causal

    @staticmethod
    def _held_columns(m: Tensor | None, k_pos: Tensor, end: int, name: str) -> Tensor | None:
        """A mask over every position so far (last dim = ``end``), cut to the keys a windowed cache still holds."""
        if m is None or m.shape[-1] == 1:
            return m
        if m.shape[-1] != end:
            raise ValueError(f"{name} has {m.shape[-1]} key columns; with this KV cache it must cover all {end} "
                             f"positions so far")
        return m.index_select(-1, k_pos)

    def _explicit(self, q, k, v, mask, causal) -> tuple[Tensor, Tensor]:
        if self.kv_heads != self.n_heads:  # each K/V head serves n_heads / kv_heads consecutive query heads
            group = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, Tq, Tk)
        if causal:
            mask = causal_mask(q.shape[2], k.shape[2], q.device)
        if mask is not None:
            scores = scores + mask if mask.is_floating_point() else scores.masked_fill(~mask, float("-inf"))
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
