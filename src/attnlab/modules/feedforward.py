"""Position-wise feed-forward networks (seed claims C10, C15).

The module receives its parts (torchtune style): ``up_proj``, ``down_proj``, an activation and, for gated units,
``gate_proj``. ReLU vs GELU vs SwiGLU is a builder's choice (:func:`build_ffn`), not an ``if`` in forward.

Hidden sizes, so that parameter counts compare (claim E10 is about quality at equal size):
  relu / gelu: two matrices d×h with h = hidden_mult · d                        -> 2·d·h parameters
  swiglu:      three matrices d×h' with h' = ⅔ · hidden_mult · d, rounded up to a multiple of ``multiple_of``
               (LLaMA's rule)                                                    -> 3·d·h' ≈ 2·d·h parameters
"""

from __future__ import annotations

import math

from torch import Tensor, nn

FFN_ACTIVATIONS = ("relu", "gelu", "swiglu")


class FeedForward(nn.Module):
    """down(act(up(x))), or down(act(gate(x)) * up(x)) when a gate is given (GLU family)."""

    def __init__(
        self,
        up_proj: nn.Linear,
        down_proj: nn.Linear,
        activation: nn.Module,
        gate_proj: nn.Linear | None = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.up_proj, self.down_proj, self.activation, self.gate_proj = up_proj, down_proj, activation, gate_proj
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:  # (..., D) -> (..., D)
        h = self.up_proj(x)
        h = self.activation(self.gate_proj(x)) * h if self.gate_proj is not None else self.activation(h)
        return self.down_proj(self.dropout(h))


def ffn_hidden_dim(activation: str, dim: int, hidden_mult: float = 4.0, multiple_of: int = 8) -> int:
    hidden = hidden_mult * dim
    if activation == "swiglu":
        hidden = 2 * hidden / 3
    return int(multiple_of * math.ceil(hidden / multiple_of))


def build_ffn(
    activation: str,
    dim: int,
    hidden_mult: float = 4.0,
    multiple_of: int = 8,
    bias: bool = True,
    dropout: float = 0.0,
) -> FeedForward:
    if activation not in FFN_ACTIVATIONS:
        raise ValueError(f"unknown ffn activation {activation!r}; choose one of {', '.join(FFN_ACTIVATIONS)}")
    hidden = ffn_hidden_dim(activation, dim, hidden_mult, multiple_of)
    up, down = nn.Linear(dim, hidden, bias=bias), nn.Linear(hidden, dim, bias=bias)
    if activation == "swiglu":
        return FeedForward(up, down, nn.SiLU(), gate_proj=nn.Linear(dim, hidden, bias=bias), dropout=dropout)
    return FeedForward(up, down, nn.ReLU() if activation == "relu" else nn.GELU(), dropout=dropout)
