"""Encoder-only masked language model (BERT, Devlin et al. 2019).

    ids (B, T), some replaced by [MASK] -> token embedding (+ positions) [+ token type 0 -> norm] -> encoder: N
    bidirectional layers -> final norm -> [transform: dense, activation, norm ->] head -> logits (B, T, V)

The token-transformer body (:mod:`attnlab.models.token_transformer`) with an ``encoder`` stack: every position
attends to the whole sequence, so the prediction at a masked position reads the text on both sides of it.

The [MASK] token: attnlab's tokenizers have none, so by default the table has one row more than the vocabulary, the
[MASK] token (``mask_id = vocab_size``), a row of its own that cannot mean anything else. A model folder's tokenizer
(a BERT's ``[MASK]``) has it in its vocabulary: ``mask_id`` names it and the table has ``vocab_size`` rows. The head
is tied to the table, so it scores [MASK] too; the loss never has it as a target, which pushes that logit down.

BERT's own parts, each off by default (``norm=post`` and these five give a ``BertForMaskedLM``:
:mod:`attnlab.checkpoints.hf_layouts`): ``embed_norm`` (a norm of the norm group's layer over the summed embedding),
``token_types`` (a table of token types, of which every token reads row 0: one segment), ``head_transform`` (the
prediction head's dense layer, activation and norm before the tied projection) and ``head_bias``.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import Tensor, nn

from ..modules.parts import resolve_norm
from .token_transformer import TokenTransformer

FIRST_RANDOM = 4  # a random replacement never draws attnlab's special tokens (ids 0-3)
HEAD_ACTIVATIONS = {"gelu": nn.GELU, "gelu_tanh": functools.partial(nn.GELU, approximate="tanh"), "relu": nn.ReLU,
                    "silu": nn.SiLU}


class HeadTransform(nn.Module):
    """BERT's prediction-head transform: (B, T, D) -> norm(act(dense(x)))."""

    def __init__(self, d_model: int, activation: str, norm_layer: Any):
        super().__init__()
        self.dense, self.act, self.norm = nn.Linear(d_model, d_model), HEAD_ACTIVATIONS[activation](), \
            norm_layer(d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.act(self.dense(x)))


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
        mask_id: int | None = None,  # the tokenizer's [MASK] id; None: a row of its own after the vocabulary
        embed_norm: bool = False,
        token_types: int = 0,
        head_transform: str | None = None,  # the transform's activation (HEAD_ACTIVATIONS); None: no transform
        head_bias: bool = False,
    ):
        if mask_id is not None and not 0 <= mask_id < vocab_size:
            raise ValueError(f"mask_id={mask_id} is outside the vocabulary (0..{vocab_size - 1})")
        if head_transform is not None and head_transform not in HEAD_ACTIVATIONS:
            raise ValueError(f"head_transform must be one of {', '.join(HEAD_ACTIVATIONS)} or null, got "
                             f"{head_transform!r}")
        if token_types < 0:
            raise ValueError(f"token_types must be >= 0, got {token_types}")
        super().__init__(vocab_size + (mask_id is None), d_model, n_layers, n_heads, max_len, dropout=dropout,
                         attn_dropout=attn_dropout, bias=bias, norm=norm, ffn=ffn, moe=moe, attn=attn, pos=pos,
                         stack="encoder", causal=False, tie_embeddings=tie_embeddings, head_bias=head_bias)
        self.mask_id = vocab_size if mask_id is None else mask_id
        # random replacements: the words of attnlab's own vocabulary; the whole of a folder's (as BERT draws them)
        self.random_ids = (FIRST_RANDOM, vocab_size) if mask_id is None else (0, vocab_size)
        layer = resolve_norm(norm).layer
        self.embed_norm = layer(d_model) if embed_norm else None
        self.type_embed = nn.Embedding(token_types, d_model) if token_types else None
        self.head_transform = HeadTransform(d_model, head_transform, layer) if head_transform else None
        self.init_weights(init)

    def around_embedding(self, x: Tensor) -> Tensor:
        if self.type_embed is not None:
            x = x + self.type_embed.weight[0]  # one segment: every token is of type 0
        return x if self.embed_norm is None else self.embed_norm(x)

    def forward(self, ids: Tensor, caches: list | None = None, *, last_only: bool = False) -> Tensor:
        if self.head_transform is None:
            return super().forward(ids, caches, last_only=last_only)
        h = self.hidden_states(ids, caches)
        return self.head(self.head_transform(h[:, -1:] if last_only else h))
