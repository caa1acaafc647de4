"""Position-wise feed-forward networks (seed claims C10, C15), one part of the ``ffn`` config group.

``conf/ffn/*.yaml`` instantiates :class:`FeedForward` with ``_partial_: true``; the block builder finishes the call
with the width (``ffn(dim=d_model, dropout=...)``). ReLU vs GELU vs SwiGLU is the YAML's choice of ``activation``
(a factory of any ``nn.Module``, e.g. ``{_target_: torch.nn.SiLU, _partial_: true}``) and ``gated``; a GeGLU is one
more YAML file, no code. The activation is built by each feed-forward (each layer, each expert), so a learnable one
(``torch.nn.PReLU``) has its own parameters in each.

    plain: down(act(up(x)))                 two matrices d×h, h = hidden_mult · d              -> 2·d·h parameters
    gated: down(act(gate(x)) * up(x))       three matrices d×h', h' = ⅔ · hidden_mult · d,     -> 3·d·h' ≈ 2·d·h
                                            rounded up to a multiple of ``multiple_of`` (LLaMA's rule)
so that parameter counts compare (claim E10 is about quality at equal size).

Biases: by default the plain units have them (the Transformer's FFN) and the gated ones do not (LLaMA's and PaLM's
SwiGLU, Shazeer's GLU variants); ``bias`` overrides either (``ffn.bias=true``). Every conf/ffn YAML writes
``bias`` into the config a checkpoint stores, so a saved net is rebuilt with the biases it was trained with whatever
the default (:mod:`attnlab.checkpoints.upgrade` gives a plain spec, which has no ``bias`` key, ``bias=True``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor, nn

from .settings import FeedForwardSettings


def ffn_hidden_dim(dim: int, hidden_mult: float = 4.0, multiple_of: int = 8, gated: bool = False) -> int:
    hidden = hidden_mult * dim
    if gated:
        hidden = 2 * hidden / 3
    return int(multiple_of * math.ceil(hidden / multiple_of))


class FeedForward(nn.Module):
    """down(act(up(x))), or down(act(gate(x)) * up(x)) when ``gated`` (GLU family). (..., D) -> (..., D)."""

    def __init__(
        self,
        dim: int,
        activation: Callable[[], nn.Module] = nn.GELU,
        *,
        gated: bool = False,
        hidden_mult: float = 4.0,
        multiple_of: int = 8,
        bias: bool | None = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        # the ffn group's values: the same check and line as train.py's (a module object as the activation would be
        # one module shared by every layer: refused there)
        FeedForwardSettings(activation=activation, gated=gated, hidden_mult=hidden_mult, multiple_of=multiple_of,
                            bias=bias)
        if bias is None:  # the references' choice: biases in the plain FFN, none in the GLU family
            bias = not gated
        hidden = ffn_hidden_dim(dim, hidden_mult, multiple_of, gated)
        # registration order up, down, activation, gate: the state-dict and optimizer order saved checkpoints rely on
        self.up_proj, self.down_proj = nn.Linear(dim, hidden, bias=bias), nn.Linear(hidden, dim, bias=bias)
        self.activation = activation()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias) if gated else None
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        h = self.up_proj(x)
        h = self.activation(self.gate_proj(x)) * h if self.gate_proj is not None else self.activation(h)
        return self.down_proj(self.dropout(h) if self.training else h)
