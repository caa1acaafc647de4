"""Transformer blocks that receive their parts (torchtune style); :mod:`attnlab.modules.stack` builds them.

    EncoderBlock:  x -> [self-attention] -> [feed-forward]                   (encoders, ViT, decoder-only LMs)
    DecoderBlock:  x -> [masked self-attention] -> [cross-attention] -> [ffn] (encoder-decoder; C22)

Each [sublayer] is wrapped in a residual connection and a norm whose placement is the block's choice:
    pre  (Xiong et al. 2020, C13): x + f(norm(x))    — stable; needs a final norm after the stack
    post (Vaswani et al. 2017, C10): norm(x + f(x))  — the original; harder to train deep (claim E8)
The feed-forward slot holds a dense feed-forward or a mixture of experts; the attention slots any attention with
the :class:`MultiHeadAttention` call signature (GQA, windowed, QK-norm are its options). The block does not care.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .norm import apply_norm


class EncoderBlock(nn.Module):
    def __init__(
        self,
        self_attn: MultiHeadAttention,
        ffn: nn.Module,
        sa_norm: nn.Module,
        ffn_norm: nn.Module,
        pre_norm: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.self_attn, self.ffn, self.sa_norm, self.ffn_norm = self_attn, ffn, sa_norm, ffn_norm
        self.pre_norm = pre_norm  # the norm part's placement (checked where it is built, modules.parts.Norm)
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()

    def _residual(self, x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor],
                  padding_mask: Tensor | None = None) -> Tensor:
        """``padding_mask`` reaches only norms whose statistics cross tokens (BatchNorm); attention gets its own.
        Dropout is the identity in evaluation: not called then (two module calls per layer per decoding step)."""
        if self.pre_norm:
            h = sublayer(apply_norm(norm, x, padding_mask))
            return x + (self.dropout(h) if self.training else h)
        h = sublayer(x)
        return apply_norm(norm, x + (self.dropout(h) if self.training else h), padding_mask)

    def forward(
        self,
        x: Tensor,
        *,
        attn_mask: Tensor | None = None,
        padding_mask: Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor:
        """x: (B, T, D); padding_mask (B, T) True = real token; cache: this layer's self-attention KV cache."""
        x = self._residual(
            x, self.sa_norm,
            lambda h: self.self_attn(h, attn_mask=attn_mask, key_padding_mask=padding_mask, is_causal=is_causal,
                                     kv_cache=cache),
            padding_mask,
        )
        return self._residual(x, self.ffn_norm, self.ffn, padding_mask)


@dataclass
class DecoderCache:
    """One decoder layer's caches: growing self-attention keys/values, and the encoder's (filled once)."""

    self_attn: KVCache
    cross_attn: KVCache

    @property
    def length(self) -> int:
        """Decoded positions so far (the self-attention cache's length)."""
        return self.self_attn.length

    def reorder(self, index: Tensor, cross: bool = True) -> None:
        """Keep the rows ``index``; ``cross=False`` leaves the encoder's keys/values as they are (the caller knows
        every kept row has the same source as the row it replaces)."""
        self.self_attn.reorder(index)
        if cross:
            self.cross_attn.reorder(index)


class DecoderBlock(EncoderBlock):
    def __init__(
        self,
        self_attn: MultiHeadAttention,
        cross_attn: MultiHeadAttention,
        ffn: nn.Module,
        sa_norm: nn.Module,
        ca_norm: nn.Module,
        ffn_norm: nn.Module,
        pre_norm: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__(self_attn, ffn, sa_norm, ffn_norm, pre_norm, dropout)
        self.cross_attn, self.ca_norm = cross_attn, ca_norm

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        padding_mask: Tensor | None = None,
        is_causal: bool = True,
        cache: DecoderCache | None = None,
        need_cross_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x: (B, T, D) decoder stream; memory: (B, S, D) the encoder's final output (None once cached).

        ``need_cross_weights``: return ``(x, weights)``, the cross-attention weights (B, H, T, S) of this call (that
        attention then takes the explicit path), for a loss or a pointer that reads them."""
        x = self._residual(
            x, self.sa_norm,
            lambda h: self.self_attn(h, attn_mask=attn_mask, key_padding_mask=padding_mask, is_causal=is_causal,
                                     kv_cache=cache.self_attn if cache else None),
            padding_mask,
        )
        x = self._residual(
            x, self.ca_norm,
            lambda h: self.cross_attn(h, memory, key_padding_mask=memory_padding_mask,
                                      kv_cache=cache.cross_attn if cache else None, need_weights=need_cross_weights),
            padding_mask,
        )
        x = self._residual(x, self.ffn_norm, self.ffn, padding_mask)
        return (x, self.cross_attn.weights) if need_cross_weights else x
