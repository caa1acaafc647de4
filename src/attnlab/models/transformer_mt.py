"""Transformer encoder-decoder for translation (seed claims C10, C22; Vaswani et al. 2017).

    src (B, S) -> embed (+ positions) -> N × EncoderBlock            -> final norm -> memory (B, S, D)
    tgt_in (B, T) -> embed (+ positions) -> M × DecoderBlock(memory)  -> final norm -> logits (B, T, V)

Every decoder layer cross-attends to the encoder's *final* output (C22). Source and target share one joint
vocabulary (the data module trains one BPE on both sides), so one embedding table serves the encoder, the decoder
and, with ``tie_embeddings``, the output projection (Press & Wolf 2017). The blocks' norm, feed-forward and MoE
come from the ``norm``/``ffn``/``moe`` config groups, positions from ``pos``.

Copy mechanism (``copy=True``, C24; See et al. 2017's pointer-generator): a gate p_gen = σ(w·[h_t; x_t]) from
the decoder's final state h_t and its input embedding x_t mixes the vocabulary softmax with the last decoder
layer's cross-attention (mean over heads) scattered onto the source token ids:

    p(y) = p_gen · softmax(logits)(y) + (1 − p_gen) · Σ_{j: src_j = y} a_tj

and the net returns log p (normalized log-probs; the task's cross-entropy and beam search take them as they are).
The joint byte-level BPE has no out-of-vocabulary source token (an unseen name is split into known pieces), so the
extended vocabulary of See et al. is not needed: copying a name is pointing at its pieces.

Decoding goes through :meth:`stepper`: the source is encoded once, each decoder layer keeps a self-attention KV
cache and its cross-attention keys/values (computed on the first step), and beam search reorders both.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..modules.attention import KVCache
from ..modules.block import DecoderCache, build_block, build_final_norm
from ..modules.positional import RotaryEmbedding, build_additive_positions
from ..modules.spec import FFNSpec, MoESpec, NormSpec, PosSpec


class TransformerMT(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        d_model: int = 256,
        n_layers: int = 3,
        n_heads: int = 4,
        max_len: int = 128,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        bias: bool = True,
        tie_embeddings: bool = True,
        norm: NormSpec | dict | None = None,
        ffn: FFNSpec | dict | None = None,
        moe: MoESpec | dict | None = None,
        pos: PosSpec | dict | None = None,
        n_encoder_layers: int | None = None,
        n_decoder_layers: int | None = None,
        copy: bool = False,
        scaled: bool = True,
    ):
        """``n_layers`` sets both stacks' depth; ``n_encoder_layers`` / ``n_decoder_layers`` override either.
        ``scaled=False`` drops the 1/√d_head of every attention (claim E3's unscaled dot products)."""
        super().__init__()
        n_encoder_layers = n_layers if n_encoder_layers is None else n_encoder_layers
        n_decoder_layers = n_layers if n_decoder_layers is None else n_decoder_layers
        self.pos_spec = PosSpec.from_cfg(pos)
        self.vocab_size, self.d_model, self.n_heads, self.max_len = vocab_size, d_model, n_heads, max_len
        self.embed = nn.Embedding(vocab_size, d_model)
        # Separate position tables for source and target (they index different sequences); None for rotary/none.
        self.src_positions = build_additive_positions(self.pos_spec.kind, max_len, d_model)
        self.tgt_positions = build_additive_positions(self.pos_spec.kind, max_len, d_model)
        rotary = (RotaryEmbedding(d_model // n_heads, max_len, self.pos_spec.rotary_base)
                  if self.pos_spec.kind == "rotary" else None)
        self.drop = nn.Dropout(dropout)
        common = dict(norm=norm, ffn=ffn, moe=moe, dropout=dropout, attn_dropout=attn_dropout, bias=bias,
                      rotary=rotary, scaled=scaled)
        self.encoder = nn.ModuleList(build_block(d_model, n_heads, **common) for _ in range(n_encoder_layers))
        self.encoder_norm = build_final_norm(norm, d_model)
        self.decoder = nn.ModuleList(build_block(d_model, n_heads, cross_attention=True, **common)
                                     for _ in range(n_decoder_layers))
        self.decoder_norm = build_final_norm(norm, d_model)
        self.out_proj = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.out_proj.weight = self.embed.weight
        self.copy = copy
        if copy:  # the pointer reads the last layer's cross-attention weights: that layer takes the explicit path
            self.copy_gate = nn.Linear(2 * d_model, 1)
            self.decoder[-1].cross_attn.return_weights = True
        self.apply(self._init_weights)
        depth = n_encoder_layers + n_decoder_layers
        for name, p in self.named_parameters():  # residual-stream writers scaled down, as in GPT-2
            if name.endswith(("out_proj.weight", "down_proj.weight")) and not name.startswith("out_proj"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * depth))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def _embed(self, ids: Tensor, positions: nn.Module | None, offset: int = 0) -> Tensor:
        if offset + ids.shape[1] > self.max_len:
            raise ValueError(f"sequence of {offset + ids.shape[1]} tokens exceeds max_len={self.max_len}")
        x = self.embed(ids)
        if positions is not None:
            x = x + positions(ids.shape[1], offset)
        return self.drop(x)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src (B, S), src_mask (B, S) True = real token -> memory (B, S, D)."""
        x = self._embed(src, self.src_positions)
        for block in self.encoder:
            x = block(x, padding_mask=src_mask)
        return self.encoder_norm(x)

    def decode(self, tgt_in: Tensor, memory: Tensor | None, src_mask: Tensor,
               caches: list[DecoderCache] | None = None, src: Tensor | None = None) -> Tensor:
        """tgt_in (B, T) -> logits (B, T, V), or log-probs with ``copy`` (then ``src`` (B, S) is needed).

        With caches, tgt_in holds only the new tokens (memory may be None once the cross-attention caches are
        filled). Right padding of tgt_in needs no mask: causal attention never lets a real position see the
        padding after it."""
        offset = caches[0].self_attn.length if caches else 0
        x = emb = self._embed(tgt_in, self.tgt_positions, offset)
        for i, block in enumerate(self.decoder):
            x = block(x, memory, memory_padding_mask=src_mask, is_causal=True, cache=caches[i] if caches else None)
        h = self.decoder_norm(x)
        logits = self.out_proj(h)
        if not self.copy:
            return logits
        attn = self.decoder[-1].cross_attn.weights.mean(dim=1)  # (B, T, S), rows sum to 1 over real sources
        p_gen = torch.sigmoid(self.copy_gate(torch.cat([h, emb], dim=-1))).float()  # (B, T, 1)
        p = p_gen * logits.float().softmax(dim=-1)
        index = src[:, None, :].expand(-1, tgt_in.shape[1], -1)  # (B, T, S) the vocabulary id of each source
        p = p.scatter_add(-1, index, (1 - p_gen) * attn.float())
        return p.clamp_min(1e-9).log()

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: scores (B, T, V) of every next target token (logits; log-probs with ``copy``)."""
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, src=src)

    def new_caches(self, batch: int, src_len: int, max_len: int | None = None, *, dtype=None,
                   device=None) -> list[DecoderCache]:
        device = device or self.embed.weight.device
        dtype = dtype or self.embed.weight.dtype
        hd = self.d_model // self.n_heads
        kv = lambda n: KVCache(batch, self.n_heads, hd, n, dtype=dtype, device=device)  # noqa: E731
        return [DecoderCache(kv(max_len or self.max_len), kv(src_len)) for _ in self.decoder]

    def stepper(self, src: Tensor, src_mask: Tensor, use_cache: bool = True) -> "TransformerMTStepper":
        return TransformerMTStepper(self, src, src_mask, use_cache)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class TransformerMTStepper:
    """The :class:`~attnlab.decoding.step.Stepper` of a :class:`TransformerMT`: encodes the source once.

    use_cache=False re-runs the decoder over the whole prefix at every step (the reference the cache must
    match, and the baseline of the beam-search benchmark).
    """

    def __init__(self, model: TransformerMT, src: Tensor, src_mask: Tensor, use_cache: bool = True):
        self.model, self.use_cache = model, use_cache
        self.src, self.src_mask = src, src_mask
        self.memory = model.encode(src, src_mask)  # (B, S, D)
        self.tokens: Tensor | None = None
        self.caches: list[DecoderCache] | None = None

    def prefill(self, prefix: Tensor) -> Tensor:
        """prefix (B, t), starting with <bos> -> logits (B, V) of the next token."""
        self.tokens = prefix
        if not self.use_cache:
            return self.model.decode(prefix, self.memory, self.src_mask, src=self.src)[:, -1]
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        self.caches = self.model.new_caches(prefix.shape[0], self.memory.shape[1], dtype=dtype)
        return self.model.decode(prefix, self.memory, self.src_mask, self.caches, src=self.src)[:, -1]

    def step(self, token: Tensor) -> Tensor:
        self.tokens = torch.cat([self.tokens, token[:, None]], dim=1)
        if not self.use_cache:
            return self.model.decode(self.tokens, self.memory, self.src_mask, src=self.src)[:, -1]
        return self.model.decode(token[:, None], None, self.src_mask, self.caches, src=self.src)[:, -1]

    def reorder(self, index: Tensor) -> None:
        self.tokens = self.tokens.index_select(0, index)
        self.memory = self.memory.index_select(0, index)
        self.src = self.src.index_select(0, index)
        self.src_mask = self.src_mask.index_select(0, index)
        for c in self.caches or []:
            c.reorder(index)
