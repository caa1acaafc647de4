"""Decoder-only language model (seed claims C10, C11; GPT).

    ids (B, T) -> token embedding (+ positions) -> decoder: N causal layers -> final norm -> head -> logits (B, T, V)

The body is :class:`~attnlab.models.token_transformer.TokenTransformer`; the head is tied to the token
embedding (``tie_embeddings``). The layers' norm, feed-forward, MoE and attention come from the
``norm``/``ffn``/``moe``/``attn`` config groups, positions from ``pos`` (see :mod:`attnlab.modules.parts`).

``causal`` (the upper-triangular mask, C6) is on by default. ``causal=False`` lets every position attend to the
whole sequence in the full-sequence forward (training, validation and test losses: the model sees the token it must
predict, claim E5). Decoding with KV caches is causal whatever the flag, prefill included: a cache holds only the
past, so there is nothing later to see. ``causal`` is a plain attribute read at every forward, so setting
``net.causal = True`` evaluates a model trained without the mask the way generation has to use it. (Claim E3's
unscaled dot products are ``attn.scaled=false``, an option of the attention group.)
"""

from __future__ import annotations

from typing import Any

from .token_transformer import TokenTransformer


class CausalLM(TokenTransformer):
    """The token-transformer body with a ``decoder`` stack and the head over the vocabulary; its ``forward`` and
    ``hidden_states`` take ids (and KV caches while decoding)."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 256,
        n_layers: int = 4,
        n_heads: int = 4,
        max_len: int = 256,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        bias: bool = True,
        tie_embeddings: bool = True,
        # the block groups' parts (attnlab.modules.parts): a config with _target_, a built part, or None
        norm: Any = None, ffn: Any = None, moe: Any = None, attn: Any = None, pos: Any = None,
        causal: bool = True,
        init: str = "gpt2",
    ):
        super().__init__(vocab_size, d_model, n_layers, n_heads, max_len, dropout=dropout, attn_dropout=attn_dropout,
                         bias=bias, norm=norm, ffn=ffn, moe=moe, attn=attn, pos=pos, stack="decoder", causal=causal,
                         tie_embeddings=tie_embeddings)
        self.init_weights(init)
