"""Sequence classification with three ways to process a sequence (seed claim C9, experiment E7).

    ids (B, T) -> token embedding -> encoder -> outputs (B, T, D) -> pool -> linear -> logits (B, K)

The encoder is the only thing that changes:

* ``rnn``: a GRU. O(T) sequential steps: position t's state depends on every earlier position, but step t cannot
  start before step t-1 has finished (not parallel over the sequence). ``bidirectional`` adds a right-to-left GRU
  (each direction d_model/2 wide, so the output stays d_model).
* ``cnn``: a stack of ``n_layers`` causal 1-D convolutions of width ``kernel_size`` (residual, pre-LayerNorm, GELU).
  Parallel over positions, but each layer widens the window an output sees by ``kernel_size - 1``: output t
  depends on exactly the inputs t-R+1 … t, with receptive field ``R = 1 + n_layers·(kernel_size - 1)``
  (:attr:`SequenceClassifier.receptive_field`). Causal (left-padded), so that the whole window of the last
  position lies inside the sequence.
* ``attention``: the repository's transformer encoder: ``n_layers`` non-causal layers built from the
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

from ..choices import ENCODERS
from ..modules.parts import BlockParts, resolve_positions
from ..modules.stack import TransformerStack, build_stack
from .base import TransformerModel

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


class AttentionEncoder(TransformerStack):
    """Positions (``pos`` group) + ``n_layers`` non-causal transformer layers + the final norm."""

    def __init__(self, d_model: int, n_layers: int, n_heads: int, max_len: int, dropout: float = 0.0,
                 attn_dropout: float = 0.0, bias: bool = True, parts: BlockParts | None = None, pos: Any = None):
        nn.Module.__init__(self)  # positions first: the parameter order of earlier checkpoints
        self.positions = resolve_positions(pos)(max_len=max_len, d_model=d_model, n_heads=n_heads)
        stack = build_stack(n_layers, d_model, n_heads, parts or BlockParts(), dropout=dropout,
                            attn_dropout=attn_dropout, bias=bias, positions=self.positions.attention)
        self.layers, self.final_norm = stack.layers, stack.final_norm

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(self.positions.add(x))  # non-causal: every position attends to every position


class SequenceClassifier(TransformerModel):
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
        super().__init__()
        if encoder not in ENCODERS:
            raise ValueError(f"unknown encoder {encoder!r}; choose one of {', '.join(ENCODERS)}")
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r}; choose one of {', '.join(POOLS)}")
        self.vocab_size, self.num_classes, self.max_len = vocab_size, num_classes, max_len
        self.encoder_kind, self.d_model, self.n_layers, self.n_heads = encoder, d_model, n_layers, n_heads
        self.pool = pool
        self.embed = nn.Embedding(vocab_size, d_model)
        self.drop = nn.Dropout(dropout)
        if encoder == "rnn":
            self.encoder = GRUEncoder(d_model, n_layers, bidirectional, dropout)
        elif encoder == "cnn":
            self.encoder = ConvEncoder(d_model, n_layers, kernel_size, dropout)
        else:
            self.encoder = AttentionEncoder(d_model, n_layers, n_heads, max_len, dropout, attn_dropout, bias,
                                            BlockParts.resolve(norm, ffn, moe, attn), pos)
        self.head = nn.Linear(d_model, num_classes)
        # xavier: linear maps; PyTorch's defaults for the embedding (N(0, 1)), the GRU and the convolutions
        self.init_weights(init)

    @staticmethod
    def block_groups(net_cfg: dict) -> tuple[str, ...]:
        """The config groups a net of this config reads (train.py refuses overrides of the others): only the
        attention encoder is built from the block groups."""
        return ("norm", "ffn", "moe", "attn", "pos") if net_cfg.get("encoder", "attention") == "attention" else ()

    def lookup_tables(self) -> list[nn.Parameter]:
        positions = getattr(self.encoder, "positions", None)
        return [self.embed.weight, *(positions.parameters() if positions is not None else ())]

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
        if ids.shape[1] > self.max_len:
            raise ValueError(f"sequence of {ids.shape[1]} tokens, max_len={self.max_len}")
        return self.encoder(self.drop(self.embed(ids)))

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, T) -> logits (B, num_classes)."""
        h = self.features(ids)
        return self.head(h[:, -1] if self.pool == "last" else h.mean(dim=1))
