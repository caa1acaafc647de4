"""Position information (seed claim C5/E4: self-attention alone is permutation-equivariant; positions fix it).

* ``sinusoidal``: fixed sin/cos table added to the embeddings (Vaswani et al. 2017).
* ``learned``: a trained table added to the embeddings (GPT-2, ViT).
* ``rotary``: RoPE (Su et al. 2021), q and k rotated by position inside every self-attention layer.
* ``none``: nothing; the model is then equivariant to permutations of its input.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

POSITION_KINDS = ("sinusoidal", "learned", "rotary", "none")


def sinusoidal_table(max_len: int, dim: int) -> Tensor:
    """(max_len, dim): PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(...)."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(max_len, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table


class SinusoidalPositions(nn.Module):
    def __init__(self, max_len: int, dim: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_len, dim), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:  # -> (length, dim), added to (B, T, dim)
        return self.table[offset : offset + length]


class LearnedPositions(nn.Module):
    def __init__(self, max_len: int, dim: int, init_std: float = 0.02):
        super().__init__()
        self.table = nn.Parameter(torch.randn(max_len, dim) * init_std)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.table.shape[0]:
            raise ValueError(f"position {offset + length} beyond the learned table ({self.table.shape[0]})")
        return self.table[offset : offset + length]


class RotaryEmbedding(nn.Module):
    """Rotates pairs of channels of q and k by an angle proportional to the position (half-split layout)."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head dimension, got {head_dim}")
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (max_len, Dh/2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)

    def forward(self, q: Tensor, k: Tensor, offset: int = 0) -> tuple[Tensor, Tensor]:
        """q, k: (B, H, T, Dh), the T positions starting at ``offset`` (the KV-cache length)."""
        t = q.shape[2]
        if offset + t > self.cos.shape[0]:
            raise ValueError(f"position {offset + t} beyond the rotary table ({self.cos.shape[0]})")
        cos, sin = self.cos[offset : offset + t], self.sin[offset : offset + t]
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)


def build_additive_positions(kind: str, max_len: int, dim: int) -> nn.Module | None:
    """The table added to the embeddings, or None for ``rotary`` (inside attention) and ``none``."""
    if kind not in POSITION_KINDS:
        raise ValueError(f"unknown position kind {kind!r}; choose one of {', '.join(POSITION_KINDS)}")
    if kind == "sinusoidal":
        return SinusoidalPositions(max_len, dim)
    if kind == "learned":
        return LearnedPositions(max_len, dim)
    return None
