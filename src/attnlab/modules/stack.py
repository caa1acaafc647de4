"""A stack of transformer layers and its final norm: the one body every transformer here is built around.

    decoder-only LM      decoder = stack(causal self-attention layers)
    encoder (ViT, MT, TTS, classifier)   encoder = stack(non-causal self-attention layers)
    encoder-decoder      encoder = stack(...); decoder = stack(layers with cross-attention over encoder output)

Every model names its stacks ``encoder`` / ``decoder``; a stack's layers are ``layers`` and its last norm
``final_norm``, so state-dict keys and attention-map names read the same in every family
(``decoder.layers.0.self_attn``). :func:`build_stack` makes one from the config groups' parts
(:class:`~attnlab.modules.parts.BlockParts`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn

from .block import DecoderBlock, DecoderCache, EncoderBlock
from .parts import BlockParts


class TransformerStack(nn.Module):
    def __init__(self, layers: list[EncoderBlock], final_norm: nn.Module):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm

    def __len__(self) -> int:
        return len(self.layers)

    def forward(self, x: Tensor, *, caches: list | None = None, **kwargs: Any) -> Tensor:
        """x (B, T, D) -> (B, T, D). ``kwargs`` go to every layer (``padding_mask``, ``is_causal``, and for decoder
        layers ``memory``, ``memory_padding_mask``); ``caches``: one per layer (:meth:`new_caches`)."""
        for i, layer in enumerate(self.layers):
            x = layer(x, cache=caches[i] if caches is not None else None, **kwargs)
        return self.final_norm(x)

    def forward_with_cross_weights(self, x: Tensor, layers: Iterable[int], *, caches: list | None = None,
                                   **kwargs: Any) -> tuple[Tensor, dict[int, Tensor]]:
        """:meth:`forward`, also returning the cross-attention weights (B, H, T, S) of the decoder ``layers`` listed
        (negative: from the last), keyed by their index: what a guided-attention loss or a copy pointer reads. Only
        those attentions take the explicit path; the others stay fused."""
        wanted = {i % len(self.layers) for i in layers}
        weights: dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers):
            cache = caches[i] if caches is not None else None
            if i in wanted:
                x, weights[i] = layer(x, cache=cache, need_cross_weights=True, **kwargs)
            else:
                x = layer(x, cache=cache, **kwargs)
        return self.final_norm(x), weights

    def new_caches(self, batch: int, max_len: int, *, memory_len: int | None = None, dtype=None,
                   device=None) -> list:
        """One empty cache per layer for incremental decoding: each attention sizes its own (GQA keeps kv_heads
        heads, a sliding window keeps W positions); decoder layers also get a cross-attention cache of
        ``memory_len`` positions, filled from the encoder output on the first step."""
        def self_cache(layer):
            return layer.self_attn.new_cache(batch, max_len, dtype=dtype, device=device)

        if not any(isinstance(layer, DecoderBlock) for layer in self.layers):
            return [self_cache(layer) for layer in self.layers]
        if memory_len is None:
            raise ValueError("a stack with cross-attention needs memory_len for its caches")
        return [DecoderCache(self_cache(layer),
                             layer.cross_attn.new_cache(batch, memory_len, dtype=dtype, device=device))
                for layer in self.layers]


def build_layer(d_model: int, n_heads: int, parts: BlockParts, *, dropout: float = 0.0, attn_dropout: float = 0.0,
                bias: bool = True, positions: nn.Module | None = None, cross_attention: bool = False,
                memory_dim: int | None = None) -> EncoderBlock:
    """One layer: an :class:`EncoderBlock`, or a :class:`DecoderBlock` with ``cross_attention``. ``positions``:
    what each self-attention applies to q/k or its scores (rotary, ALiBi), None for additive positions."""
    def attn(**kw):
        return parts.attn(d_model, n_heads, dropout=attn_dropout, bias=bias, **kw)

    norm = parts.norm.layer
    ffn = parts.feedforward(d_model, dropout)
    if not cross_attention:
        return EncoderBlock(attn(positions=positions), ffn, norm(d_model), norm(d_model), parts.norm.pre,
                            dropout)
    self_attn = attn(positions=positions)
    # cross-attention reads the whole source: no window, no positions of its own
    cross_attn = attn(kv_dim=memory_dim or d_model, window=None)
    return DecoderBlock(self_attn, cross_attn, ffn, norm(d_model), norm(d_model), norm(d_model),
                        parts.norm.pre, dropout)


def build_stack(n_layers: int, d_model: int, n_heads: int, parts: BlockParts, **layer_kwargs: Any) -> TransformerStack:
    """``n_layers`` layers of :func:`build_layer` and the final norm the norm placement needs."""
    layers = [build_layer(d_model, n_heads, parts, **layer_kwargs) for _ in range(n_layers)]
    return TransformerStack(layers, parts.norm.final(d_model))
