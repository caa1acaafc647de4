"""Encoder-only masked language model (BERT, Devlin et al. 2019).

    ids (B, T), some replaced by [MASK] -> token embedding (+ positions) -> encoder: N bidirectional layers ->
    final norm -> head -> logits (B, T, V + 1)

The token-transformer body (:mod:`attnlab.models.token_transformer`) with an ``encoder`` stack: every position
attends to the whole sequence, so the prediction at a masked position reads the text on both sides of it. The
token table has one row more than the vocabulary, the [MASK] token (``mask_id = vocab_size``): the tokenizers here
have no such token, and a row of its own keeps it from meaning anything else. The head is tied to the table, so it
scores [MASK] too; the loss never has it as a target, which pushes that logit down.
"""

from __future__ import annotations

from typing import Any

from .token_transformer import TokenTransformer


class MaskedLM(TokenTransformer):
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
        init: str = "gpt2",
    ):
        super().__init__(vocab_size + 1, d_model, n_layers, n_heads, max_len, dropout=dropout,
                         attn_dropout=attn_dropout, bias=bias, norm=norm, ffn=ffn, moe=moe, attn=attn, pos=pos,
                         stack="encoder", causal=False, tie_embeddings=tie_embeddings)
        self.mask_id = vocab_size  # the extra row
        self.init_weights(init)
