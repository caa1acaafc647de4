"""Transformer blocks that receive their parts (torchtune style), and the builder that makes those parts.

    EncoderBlock:  x -> [self-attention] -> [feed-forward]                   (encoders, ViT, decoder-only LMs)
    DecoderBlock:  x -> [masked self-attention] -> [cross-attention] -> [ffn] (encoder-decoder; C22)

Each [sublayer] is wrapped in a residual connection and a norm whose placement is the block's choice:
    pre  (Xiong et al. 2020, C13): x + f(norm(x))    — stable; needs a final norm after the stack
    post (Vaswani et al. 2017, C10): norm(x + f(x))  — the original; harder to train deep (claim E8)
The feed-forward slot holds a dense :class:`FeedForward` or a :class:`MixtureOfExperts`; the block does not care.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .feedforward import build_ffn
from .moe import MixtureOfExperts
from .norm import apply_norm, build_norm
from .spec import FFNSpec, MoESpec, NormSpec


class EncoderBlock(nn.Module):
    def __init__(
        self,
        self_attn: MultiHeadAttention,
        ffn: nn.Module,
        sa_norm: nn.Module,
        ffn_norm: nn.Module,
        placement: str = "pre",
        dropout: float = 0.0,
    ):
        super().__init__()
        if placement not in ("pre", "post"):
            raise ValueError(f"norm placement must be 'pre' or 'post', got {placement!r}")
        self.self_attn, self.ffn, self.sa_norm, self.ffn_norm = self_attn, ffn, sa_norm, ffn_norm
        self.placement = placement
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()

    def _residual(self, x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor],
                  padding_mask: Tensor | None = None) -> Tensor:
        """``padding_mask`` reaches only norms whose statistics cross tokens (BatchNorm); attention gets its own."""
        if self.placement == "pre":
            return x + self.dropout(sublayer(apply_norm(norm, x, padding_mask)))
        return apply_norm(norm, x + self.dropout(sublayer(x)), padding_mask)

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

    def reorder(self, index: Tensor) -> None:
        self.self_attn.reorder(index)
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
        placement: str = "pre",
        dropout: float = 0.0,
    ):
        super().__init__(self_attn, ffn, sa_norm, ffn_norm, placement, dropout)
        self.cross_attn, self.ca_norm = cross_attn, ca_norm

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        memory_padding_mask: Tensor | None = None,
        padding_mask: Tensor | None = None,
        is_causal: bool = True,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """x: (B, T, D) decoder stream; memory: (B, S, D) the encoder's final output (None once cached)."""
        x = self._residual(
            x, self.sa_norm,
            lambda h: self.self_attn(h, key_padding_mask=padding_mask, is_causal=is_causal,
                                     kv_cache=cache.self_attn if cache else None),
            padding_mask,
        )
        x = self._residual(
            x, self.ca_norm,
            lambda h: self.cross_attn(h, memory, key_padding_mask=memory_padding_mask,
                                      kv_cache=cache.cross_attn if cache else None),
            padding_mask,
        )
        return self._residual(x, self.ffn_norm, self.ffn, padding_mask)


def build_feedforward_slot(d_model: int, ffn: FFNSpec, moe: MoESpec, dropout: float = 0.0) -> nn.Module:
    """A dense feed-forward of the chosen kind, or an MoE whose experts are each such a feed-forward."""
    make = lambda: build_ffn(ffn.activation, d_model, ffn.hidden_mult, ffn.multiple_of, ffn.bias, dropout)  # noqa: E731
    if not moe.enabled:
        return make()
    experts = [make() for _ in range(moe.num_experts)]
    return MixtureOfExperts(d_model, experts, moe.top_k, moe.aux_loss_coef, moe.z_loss_coef)


def build_block(
    d_model: int,
    n_heads: int,
    *,
    norm: NormSpec | dict | None = None,
    ffn: FFNSpec | dict | None = None,
    moe: MoESpec | dict | None = None,
    dropout: float = 0.0,
    attn_dropout: float = 0.0,
    bias: bool = True,
    rotary: nn.Module | None = None,
    cross_attention: bool = False,
    memory_dim: int | None = None,
    scaled: bool = True,
) -> EncoderBlock:
    """Build one block from the config groups' specs: an EncoderBlock, or a DecoderBlock if ``cross_attention``.

    ``scaled=False`` drops the 1/√d_head of every attention in the block (claim E3)."""
    norm, ffn, moe = NormSpec.from_cfg(norm), FFNSpec.from_cfg(ffn), MoESpec.from_cfg(moe)
    attn = lambda **kw: MultiHeadAttention(  # noqa: E731
        d_model, n_heads, dropout=attn_dropout, bias=bias, scaled=scaled, **kw)
    mk_norm = lambda: build_norm(norm.kind, d_model, norm.eps)  # noqa: E731
    slot = build_feedforward_slot(d_model, ffn, moe, dropout)
    if not cross_attention:
        return EncoderBlock(attn(rotary=rotary), slot, mk_norm(), mk_norm(), norm.placement, dropout)
    return DecoderBlock(
        attn(rotary=rotary), attn(kv_dim=memory_dim or d_model), slot,
        mk_norm(), mk_norm(), mk_norm(), norm.placement, dropout,
    )


def build_final_norm(norm: NormSpec | dict | None, d_model: int) -> nn.Module:
    """Pre-norm stacks end with a norm (their residual stream is never normalized); post-norm ones already did."""
    norm = NormSpec.from_cfg(norm)
    return build_norm(norm.kind, d_model, norm.eps) if norm.placement == "pre" else nn.Identity()
