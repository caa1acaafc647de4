"""Decoder-only language model (seed claims C10, C11; GPT).

    ids (B, T) -> token embedding (+ positions) -> N × EncoderBlock(causal) -> final norm -> logits (B, T, V)

The output projection is tied to the token embedding. The blocks' norm, feed-forward and MoE come from the
``norm``/``ffn``/``moe`` config groups, positions from ``pos``.

Two switches exist for the seeds' claims, both on by default: ``scaled`` (divide attention scores by √d_head;
``False`` is claim E3) and ``causal`` (the upper-triangular mask, C6). ``causal=False`` lets every position attend
to the whole sequence in the full-sequence forward (training, validation and test losses: the model sees the token
it must predict, claim E5). Decoding with KV caches is causal whatever the flag, prefill included: a cache holds
only the past, so there is nothing later to see. ``causal`` is a plain attribute read at every forward, so setting
``net.causal = True`` evaluates a model trained without the mask the way generation has to use it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..modules.attention import KVCache
from ..modules.block import build_block, build_final_norm
from ..modules.positional import RotaryEmbedding, build_additive_positions
from ..modules.spec import FFNSpec, MoESpec, NormSpec, PosSpec


class CausalLM(nn.Module):
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
        norm: NormSpec | dict | None = None,
        ffn: FFNSpec | dict | None = None,
        moe: MoESpec | dict | None = None,
        pos: PosSpec | dict | None = None,
        scaled: bool = True,
        causal: bool = True,
    ):
        super().__init__()
        self.causal = causal
        self.norm_spec, self.pos_spec = NormSpec.from_cfg(norm), PosSpec.from_cfg(pos)
        self.vocab_size, self.d_model, self.n_layers, self.n_heads, self.max_len = (
            vocab_size, d_model, n_layers, n_heads, max_len)
        self.embed = nn.Embedding(vocab_size, d_model)
        self.positions = build_additive_positions(self.pos_spec.kind, max_len, d_model)
        rotary = (RotaryEmbedding(d_model // n_heads, max_len, self.pos_spec.rotary_base)
                  if self.pos_spec.kind == "rotary" else None)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            build_block(d_model, n_heads, norm=norm, ffn=ffn, moe=moe, dropout=dropout,
                        attn_dropout=attn_dropout, bias=bias, rotary=rotary, scaled=scaled)
            for _ in range(n_layers)
        )
        self.final_norm = build_final_norm(norm, d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by 1/√(2L) so its variance stays put.
        for name, p in self.named_parameters():
            if name.endswith(("out_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def new_caches(self, batch: int, max_len: int | None = None, *, dtype=None, device=None) -> list[KVCache]:
        """One empty KV cache per layer for incremental decoding."""
        device = device or self.embed.weight.device
        dtype = dtype or self.embed.weight.dtype
        head_dim = self.d_model // self.n_heads
        return [KVCache(batch, self.n_heads, head_dim, max_len or self.max_len, dtype=dtype, device=device)
                for _ in self.blocks]

    def hidden_states(self, ids: Tensor, caches: list[KVCache] | None = None) -> Tensor:
        """ids (B, T) -> final normalized hidden states (B, T, D). With caches, ids are the next T tokens."""
        offset = caches[0].length if caches else 0
        if offset + ids.shape[1] > self.max_len:
            raise ValueError(f"sequence of {offset + ids.shape[1]} tokens exceeds max_len={self.max_len}")
        x = self.embed(ids)
        if self.positions is not None:
            x = x + self.positions(ids.shape[1], offset)
        x = self.drop(x)
        causal = self.causal or caches is not None  # a cache is filled left to right: decoding is always causal
        for i, block in enumerate(self.blocks):
            x = block(x, is_causal=causal, cache=caches[i] if caches else None)
        return self.final_norm(x)

    def forward(self, ids: Tensor, caches: list[KVCache] | None = None, *, last_only: bool = False) -> Tensor:
        """ids (B, T) -> logits (B, T, V); ``last_only``: (B, 1, V), the head on the last position only
        (decoding needs no more: a prefill or a no-cache step would otherwise build all T positions' logits)."""
        h = self.hidden_states(ids, caches)
        return self.lm_head(h[:, -1:] if last_only else h)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters; without the embedding table (tied to the head) and additive positions, as in scaling laws."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.embed.weight.numel()
            if self.positions is not None:
                n -= sum(p.numel() for p in self.positions.parameters())
        return n

    def active_params(self) -> int:
        """Non-embedding parameters a token actually passes through (MoE: router + top-k of E experts)."""
        from ..modules.moe import moe_layers

        n = self.num_params(non_embedding=True)
        for m in moe_layers(self):
            per_expert = sum(p.numel() for p in m.experts[0].parameters())
            n -= per_expert * (m.num_experts - m.top_k)
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward), PaLM/nanoGPT estimate: 6·N_active + 12·L·d·T.

        The head (tied, so not in N) costs 6·d·V and is added as well.
        """
        return 6 * self.active_params() + 6 * self.d_model * self.vocab_size + 12 * self.n_layers * self.d_model * seq_len
