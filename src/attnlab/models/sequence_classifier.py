"""Sequence classification with three ways to process a sequence (seed claim C9, experiment E7).

    ids (B, T) -> token embedding (+ positions) -> encoder -> outputs (B, T, D) -> pool -> linear -> logits (B, K)

The :class:`~attnlab.models.token_transformer.TokenTransformer` body with an ``encoder`` stack and an untied head over
the classes, read at one position or the mean. The encoder is the only thing that changes:

* ``rnn``: a GRU. O(T) sequential steps: position t's state depends on every earlier position, but step t cannot
  start before step t-1 has finished (not parallel over the sequence). ``bidirectional`` adds a right-to-left GRU
  (each direction d_model/2 wide, so the output stays d_model).
* ``cnn``: a stack of ``n_layers`` causal 1-D convolutions of width ``kernel_size`` (residual, pre-LayerNorm, GELU).
  Parallel over positions, but each layer widens the window an output sees by ``kernel_size - 1``: output t
  depends on exactly the inputs t-R+1 … t, with receptive field ``R = 1 + n_layers·(kernel_size - 1)``
  (:attr:`SequenceClassifier.receptive_field`). Causal (left-padded), so that the whole window of the last
  position lies inside the sequence.
* ``attention``: the body's transformer encoder: ``n_layers`` non-causal layers built from the
  ``norm``/``ffn``/``moe``/``attn``/``pos`` config groups. Parallel over positions, and every output sees every input
  from the first layer on (O(T²) scores per layer).

``pool``: ``last`` reads the output at the last position (the tasks here put the question there; an RNN's usual
readout), ``mean`` averages every position's output. Note that mean pooling is itself a global operation: it lets a
CNN gather local detections from the whole sequence, so a receptive-field comparison reads out at one position.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ..core.choices import ENCODERS
from ..modules.positional import NoPositions
from .token_transformer import TokenTransformer

POOLS = ("last", "mean")


class GRUEncoder(nn.Module):
    """(B, T, D) -> (B, T, D): a (bi)directional GRU, ``n_layers`` deep."""

    def __init__(self, d_model: int, n_layers: int, bidirectional: bool = False, dropout: float = 0.0):
        super().__init__()
        if bidirectional and d_model % 2:
            raise ValueError(f"a bidirectional GRU needs an even d_model (d_model/2 per direction), got {d_model}")
        hidden = d_model // 2 if bidirectional else d_model
        self.rnn = nn.GRU(d_model, hidden, num_layers=n_layers, batch_first=True, bidirectional=bidirectional,
                          dropout=dropout if n_layers > 1 else 0.0)

    def forward(self, x: Tensor) -> Tensor:
        return self.rnn(x)[0]


class ConvLayer(nn.Module):
    """x + dropout(GELU(causal_conv(LayerNorm(x)))): output t reads inputs t-k+1 … t."""

    def __init__(self, d_model: int, kernel_size: int, dropout: float = 0.0):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.conv = nn.Conv1d(d_model, d_model, kernel_size)
        self.drop = nn.Dropout(dropout)
        self.left_pad = kernel_size - 1

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D)
        h = self.norm(x).transpose(1, 2)  # (B, D, T)
        h = self.conv(F.pad(h, (self.left_pad, 0)))  # pad on the left only: causal, length kept
        return x + self.drop(F.gelu(h.transpose(1, 2)))


class ConvEncoder(nn.Module):
    """``n_layers`` :class:`ConvLayer` s and a final LayerNorm; receptive field ``1 + n_layers·(kernel_size-1)``."""

    def __init__(self, d_model: int, n_layers: int, kernel_size: int = 3, dropout: float = 0.0):
        super().__init__()
        if kernel_size < 1 or n_layers < 1:
            raise ValueError(f"kernel_size and n_layers must be >= 1, got {kernel_size}, {n_layers}")
        self.layers = nn.ModuleList(ConvLayer(d_model, kernel_size, dropout) for _ in range(n_layers))
        self.final_norm = nn.LayerNorm(d_model)
        self.receptive_field = 1 + n_layers * (kernel_size - 1)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.final_norm(x)


class SequenceClassifier(TokenTransformer):
    """ids (B, T) -> logits (B, num_classes) through one of :data:`ENCODERS` (see the module docstring).

    ``norm``, ``ffn``, ``moe``, ``attn``, ``pos``, ``n_heads`` and ``attn_dropout`` are read by the attention
    encoder only;
    ``kernel_size`` by the CNN only; ``bidirectional`` by the RNN only.
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        max_len: int = 128,
        encoder: str = "attention",
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        kernel_size: int = 3,
        bidirectional: bool = False,
        pool: str = "last",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        bias: bool = True,
        # the block groups' parts (attnlab.modules.parts): a config with _target_, a built part, or None
        norm: Any = None, ffn: Any = None, moe: Any = None, attn: Any = None, pos: Any = None,
        init: str = "xavier",
    ):
        if encoder not in ENCODERS:
            raise ValueError(f"unknown encoder {encoder!r}; choose one of {', '.join(ENCODERS)}")
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r}; choose one of {', '.join(POOLS)}")
        custom = {"rnn": lambda: GRUEncoder(d_model, n_layers, bidirectional, dropout),
                  "cnn": lambda: ConvEncoder(d_model, n_layers, kernel_size, dropout)}.get(encoder)
        # the RNN and the CNN know the order of their inputs: no positions
        super().__init__(vocab_size, d_model, n_layers, n_heads, max_len, dropout=dropout, attn_dropout=attn_dropout,
                         bias=bias, norm=norm, ffn=ffn, moe=moe, attn=attn,
                         pos=pos if custom is None else NoPositions, stack="encoder", causal=False,
                         head_size=num_classes, head_bias=True, tie_embeddings=False, custom_stack=custom)
        self.num_classes, self.encoder_kind, self.pool = num_classes, encoder, pool
        # xavier: linear maps; PyTorch's defaults for the embedding (N(0, 1)), the GRU and the convolutions
        self.init_weights(init)

    def sequence_heads(self) -> list[nn.Module]:
        return [self.head]

    @property
    def receptive_field(self) -> int | None:
        """How many input positions one output position can depend on: ``1 + L·(k-1)`` for the CNN; None (the
        whole sequence) for the RNN (the positions before it; after it too if bidirectional) and attention."""
        return self.encoder.receptive_field if self.encoder_kind == "cnn" else None

    @property
    def sequential_steps(self) -> int:
        """Operations that must run one after another per forward pass at length ``max_len``: T per GRU layer,
        one per convolution or attention layer."""
        return self.n_layers * (self.max_len if self.encoder_kind == "rnn" else 1)

    def features(self, ids: Tensor) -> Tensor:
        """ids (B, T) -> every position's output (B, T, D)."""
        return self.encoder(self.embed_tokens(ids))  # non-causal: every position attends to every position

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, T) -> logits (B, num_classes)."""
        h = self.features(ids)
        return self.head(h[:, -1] if self.pool == "last" else h.mean(dim=1))
