"""The body every token transformer here is built on (language models, the translation decoder, the classifier).

    ids (B, T) -> token embedding (+ positions) -> dropout -> stack: N layers -> final norm -> head -> (B, T, K)

Options, all at construction:

* ``stack``: the stack's name, ``"decoder"`` (a model that generates) or ``"encoder"`` (one that reads);
  ``causal``: whether its full-sequence forward masks the future (decoding with KV caches always does).
* ``source_layers``: an encoder-decoder. A source stream (its own positions and a bidirectional ``encoder`` of
  that many layers) shares the token table, and every decoder layer cross-attends to the encoder's final output.
* ``head_size`` (default: the vocabulary) and ``head_bias``; ``tie_embeddings`` makes the head the token table
  (Press & Wolf 2017), so it needs ``head_size == vocab_size``.
* ``custom_stack``: a factory of another ``(B, T, D) -> (B, T, D)`` module in the stack's place (the classifier's
  GRU or convolutions); ``pos`` is then the caller's choice (the classifier gives none).

The layers' norm, feed-forward, MoE and attention come from the ``norm``/``ffn``/``moe``/``attn`` config groups,
positions from ``pos`` (:mod:`attnlab.modules.parts`); each stream gets its own positions.

The submodules are registered under the names (and in the order) the state dicts use, so that a family's
checkpoints keep their keys and its parameters their creation order (the same seed gives the same init):
``embed``, ``positions`` (``src_positions`` and ``tgt_positions`` in an encoder-decoder), ``drop``, ``encoder``
and/or ``decoder`` (each with ``layers`` and ``final_norm``), ``head``. The subclass initializes the weights
(:meth:`~attnlab.models.base.TransformerModel.init_weights`) once it has added its own parts.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import Tensor, nn

from ..modules.parts import BlockParts, resolve_positions
from ..modules.positional import Positions
from ..modules.stack import build_stack
from .base import TransformerModel

STACKS = ("decoder", "encoder")


class TokenTransformer(TransformerModel):
    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        max_len: int,
        *,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        bias: bool = True,
        # the block groups' parts (attnlab.modules.parts): a config with _target_, a built part, or None
        norm: Any = None, ffn: Any = None, moe: Any = None, attn: Any = None, pos: Any = None,
        stack: str = "decoder",
        causal: bool = True,
        source_layers: int | None = None,
        head_size: int | None = None,
        head_bias: bool = False,
        tie_embeddings: bool = True,
        custom_stack: Callable[[], nn.Module] | None = None,
    ):
        super().__init__()
        if stack not in STACKS:
            raise ValueError(f"stack must be one of {', '.join(STACKS)}, got {stack!r}")
        if source_layers is not None and stack != "decoder":
            raise ValueError("an encoder-decoder's stack is its decoder: stack='decoder' with source_layers")
        head_size = vocab_size if head_size is None else head_size
        if tie_embeddings and head_size != vocab_size:
            raise ValueError(f"a head tied to the token table has vocab_size={vocab_size} outputs, not {head_size}")
        self.vocab_size, self.d_model, self.n_layers, self.n_heads, self.max_len = (
            vocab_size, d_model, n_layers, n_heads, max_len)
        self.stack_name, self.causal = stack, causal
        parts = BlockParts.resolve(norm, ffn, moe, attn)
        positions = resolve_positions(pos)
        self.embed = nn.Embedding(vocab_size, d_model)
        if source_layers is None:
            self.positions = positions(max_len=max_len, d_model=d_model, n_heads=n_heads)
        else:  # separate positions for source and target: they index different sequences
            self.src_positions = positions(max_len=max_len, d_model=d_model, n_heads=n_heads)
            self.tgt_positions = positions(max_len=max_len, d_model=d_model, n_heads=n_heads)
        self.drop = nn.Dropout(dropout)
        common = dict(dropout=dropout, attn_dropout=attn_dropout, bias=bias)
        if source_layers is not None:
            self.encoder = build_stack(source_layers, d_model, n_heads, parts,
                                       positions=self.src_positions.attention, **common)
        if custom_stack is not None:
            layers = custom_stack()
        else:
            layers = build_stack(n_layers, d_model, n_heads, parts, cross_attention=source_layers is not None,
                                 positions=self.stack_positions.attention, **common)
        setattr(self, stack, layers)
        self.head = nn.Linear(d_model, head_size, bias=head_bias)
        if tie_embeddings:
            self.head.weight = self.embed.weight

    @property
    def stack(self) -> nn.Module:
        """The stack the head reads (``decoder`` or ``encoder``)."""
        return getattr(self, self.stack_name)

    @property
    def stack_positions(self) -> Positions:
        """The positions of the stream the stack reads."""
        return self.tgt_positions if hasattr(self, "tgt_positions") else self.positions

    def lookup_tables(self) -> list[nn.Parameter]:
        return [self.embed.weight, *(p for m in self.children() if isinstance(m, Positions) for p in m.parameters())]

    def embed_tokens(self, ids: Tensor, offset: int = 0, positions: Positions | None = None) -> Tensor:
        """ids (B, T), the tokens at positions ``offset`` .. ``offset + T - 1`` of the stack's stream (or of
        ``positions``' stream) -> the stack's input (B, T, D)."""
        if offset + ids.shape[1] > self.max_len:
            raise ValueError(f"sequence of {offset + ids.shape[1]} tokens exceeds max_len={self.max_len}")
        positions = self.stack_positions if positions is None else positions
        return self.drop(self.around_embedding(positions.add(self.embed(ids), offset)))

    def around_embedding(self, x: Tensor) -> Tensor:
        """What a family adds to the summed embedding before the dropout (BERT: a token type and a norm)."""
        return x

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """An encoder-decoder's source: src (B, S), src_mask (B, S) True = real token -> memory (B, S, D)."""
        return self.encoder(self.embed_tokens(src, positions=self.src_positions), padding_mask=src_mask)

    def new_caches(self, batch: int, max_len: int | None = None, *, memory_len: int | None = None, dtype=None,
                   device=None) -> list:
        """One empty cache per layer for incremental decoding (with a source: ``memory_len`` positions of it)."""
        return self.stack.new_caches(batch, max_len or self.max_len, memory_len=memory_len,
                                     dtype=dtype or self.embed.weight.dtype, device=device or self.embed.weight.device)

    def hidden_states(self, ids: Tensor, caches: list | None = None, **stack_kwargs: Any) -> Tensor:
        """ids (B, T) -> final normalized hidden states (B, T, D). With caches, ids are the next T tokens.
        ``stack_kwargs`` go to every layer (``padding_mask``; ``memory``, ``memory_padding_mask`` with a source)."""
        x = self.embed_tokens(ids, caches[0].length if caches else 0)
        causal = self.causal or caches is not None  # a cache is filled left to right: decoding is always causal
        return self.stack(x, is_causal=causal, caches=caches, **stack_kwargs)

    def forward(self, ids: Tensor, caches: list | None = None, *, last_only: bool = False) -> Tensor:
        """ids (B, T) -> logits (B, T, K); ``last_only``: (B, 1, K), the head on the last position only
        (decoding needs no more: a prefill or a no-cache step would otherwise build all T positions' logits)."""
        h = self.hidden_states(ids, caches)
        return self.head(h[:, -1:] if last_only else h)
