"""Transformer encoder-decoder for translation (seed claims C10, C22; Vaswani et al. 2017).

    src (B, S) -> embed (+ positions) -> encoder: N layers               -> final norm -> memory (B, S, D)
    tgt_in (B, T) -> embed (+ positions) -> decoder: M layers(memory)    -> final norm -> head -> logits (B, T, V)

Every decoder layer cross-attends to the encoder's *final* output (C22). Source and target share one joint
vocabulary (the data module trains one BPE on both sides), so one embedding table serves the encoder, the decoder
and, with ``tie_embeddings``, the head (Press & Wolf 2017): the
:class:`~attnlab.models.token_transformer.TokenTransformer` body with a source. The layers' norm, feed-forward, MoE
and attention come from the ``norm``/``ffn``/``moe``/``attn`` config groups, positions from ``pos`` (see
:mod:`attnlab.modules.parts`).

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

from typing import Any

import torch
from torch import Tensor, nn

from ..modules.block import DecoderCache
from .token_transformer import TokenTransformer


class TransformerMT(TokenTransformer):
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
        # the block groups' parts (attnlab.modules.parts): a config with _target_, a built part, or None
        norm: Any = None, ffn: Any = None, moe: Any = None, attn: Any = None, pos: Any = None,
        n_encoder_layers: int | None = None,
        n_decoder_layers: int | None = None,
        copy: bool = False,
        init: str = "gpt2",
    ):
        """``n_layers`` sets both stacks' depth; ``n_encoder_layers`` / ``n_decoder_layers`` override either."""
        n_encoder_layers = n_layers if n_encoder_layers is None else n_encoder_layers
        n_decoder_layers = n_layers if n_decoder_layers is None else n_decoder_layers
        super().__init__(vocab_size, d_model, n_decoder_layers, n_heads, max_len, dropout=dropout,
                         attn_dropout=attn_dropout, bias=bias, norm=norm, ffn=ffn, moe=moe, attn=attn, pos=pos,
                         stack="decoder", causal=True, source_layers=n_encoder_layers, tie_embeddings=tie_embeddings)
        self.copy = copy
        if copy:  # the pointer reads the last layer's cross-attention weights (that layer takes the explicit path)
            self.copy_gate = nn.Linear(2 * d_model, 1)
        self.init_weights(init)

    def decode(self, tgt_in: Tensor, memory: Tensor | None, src_mask: Tensor,
               caches: list[DecoderCache] | None = None, src: Tensor | None = None) -> Tensor:
        """tgt_in (B, T) -> logits (B, T, V), or log-probs with ``copy`` (then ``src`` (B, S) is needed).

        With caches, tgt_in holds only the new tokens (memory may be None once the cross-attention caches are
        filled). Right padding of tgt_in needs no mask: causal attention never lets a real position see the
        padding after it."""
        emb = self.embed_tokens(tgt_in, caches[0].length if caches else 0)
        common = dict(memory=memory, memory_padding_mask=src_mask, is_causal=True, caches=caches)
        if not self.copy:
            return self.head(self.decoder(emb, **common))
        h, cross = self.decoder.forward_with_cross_weights(emb, [-1], **common)
        logits = self.head(h)
        attn = cross[len(self.decoder) - 1].mean(dim=1)  # (B, T, S), rows sum to 1 over real sources
        p_gen = torch.sigmoid(self.copy_gate(torch.cat([h, emb], dim=-1))).float()  # (B, T, 1)
        p = p_gen * logits.float().softmax(dim=-1)
        index = src[:, None, :].expand(-1, tgt_in.shape[1], -1)  # (B, T, S) the vocabulary id of each source
        p = p.scatter_add(-1, index, (1 - p_gen) * attn.float())
        return p.clamp_min(1e-9).log()

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: scores (B, T, V) of every next target token (logits; log-probs with ``copy``)."""
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, src=src)

    def stepper(self, src: Tensor, src_mask: Tensor, use_cache: bool = True) -> "TransformerMTStepper":
        return TransformerMTStepper(self, src, src_mask, use_cache)


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
        self.caches = self.model.new_caches(prefix.shape[0], memory_len=self.memory.shape[1], dtype=dtype)
        return self.model.decode(prefix, self.memory, self.src_mask, self.caches, src=self.src)[:, -1]

    def step(self, token: Tensor) -> Tensor:
        self.tokens = torch.cat([self.tokens, token[:, None]], dim=1)
        if not self.use_cache:
            return self.model.decode(self.tokens, self.memory, self.src_mask, src=self.src)[:, -1]
        return self.model.decode(token[:, None], None, self.src_mask, self.caches, src=self.src)[:, -1]

    def reorder(self, index: Tensor) -> None:
        self.tokens = self.tokens.index_select(0, index)
        src, src_mask = self.src.index_select(0, index), self.src_mask.index_select(0, index)
        # The encoder output and the cross-attention keys/values are functions of a row's source: when every row
        # keeps one with the same source (beam search within its sentences, none finished), they need no copy.
        same_source = (src.shape == self.src.shape and torch.equal(src, self.src)
                       and torch.equal(src_mask, self.src_mask))
        self.src, self.src_mask = src, src_mask
        if not same_source:
            self.memory = self.memory.index_select(0, index)
        for c in self.caches or []:
            c.reorder(index, cross=not same_source)
