"""Decoder-only language model (seed claims C10, C11; GPT).

    ids (B, T) -> token embedding (+ positions) -> decoder: N causal layers -> final norm -> head -> logits (B, T, V)

The head is tied to the token embedding. The layers' norm, feed-forward, MoE and attention come from the
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

from torch import Tensor, nn

from ..modules.attention import KVCache
from ..modules.parts import BlockParts, resolve_positions
from ..modules.stack import build_stack
from .base import TransformerModel


class CausalLM(TransformerModel):
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
        super().__init__()
        self.causal = causal
        self.vocab_size, self.d_model, self.n_layers, self.n_heads, self.max_len = (
            vocab_size, d_model, n_layers, n_heads, max_len)
        parts = BlockParts.resolve(norm, ffn, moe, attn)
        self.embed = nn.Embedding(vocab_size, d_model)
        self.positions = resolve_positions(pos)(max_len=max_len, d_model=d_model, n_heads=n_heads)
        self.drop = nn.Dropout(dropout)
        self.decoder = build_stack(n_layers, d_model, n_heads, parts, dropout=dropout, attn_dropout=attn_dropout,
                                   bias=bias, positions=self.positions.attention)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.embed.weight
        self.init_weights(init)

    def lookup_tables(self) -> list[nn.Parameter]:
        return [self.embed.weight, *self.positions.parameters()]

    def new_caches(self, batch: int, max_len: int | None = None, *, dtype=None, device=None) -> list[KVCache]:
        """One empty KV cache per layer for incremental decoding."""
        return self.decoder.new_caches(batch, max_len or self.max_len, dtype=dtype or self.embed.weight.dtype,
                                       device=device or self.embed.weight.device)

    def hidden_states(self, ids: Tensor, caches: list[KVCache] | None = None) -> Tensor:
        """ids (B, T) -> final normalized hidden states (B, T, D). With caches, ids are the next T tokens."""
        offset = caches[0].length if caches else 0
        if offset + ids.shape[1] > self.max_len:
            raise ValueError(f"sequence of {offset + ids.shape[1]} tokens exceeds max_len={self.max_len}")
        x = self.drop(self.positions.add(self.embed(ids), offset))
        causal = self.causal or caches is not None  # a cache is filled left to right: decoding is always causal
        return self.decoder(x, is_causal=causal, caches=caches)

    def forward(self, ids: Tensor, caches: list[KVCache] | None = None, *, last_only: bool = False) -> Tensor:
        """ids (B, T) -> logits (B, T, V); ``last_only``: (B, 1, V), the head on the last position only
        (decoding needs no more: a prefill or a no-cache step would otherwise build all T positions' logits)."""
        h = self.hidden_states(ids, caches)
        return self.head(h[:, -1:] if last_only else h)
