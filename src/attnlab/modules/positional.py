"""Position information (seed claim C5/E4: self-attention alone is permutation-equivariant; positions fix it).

* ``sinusoidal``: fixed sin/cos table added to the embeddings (Vaswani et al. 2017).
* ``learned``: a trained table added to the embeddings (GPT-2, ViT).
* ``rotary``: RoPE (Su et al. 2021), q and k rotated by position inside every self-attention layer.
* ``alibi``: ALiBi (Press et al. 2022), a per-head linear penalty on the distance |i - j| added to the scores.
* ``none``: nothing; the model is then equivariant to permutations of its input.

Two kinds of parts:

* :class:`Positions` is a stream's part (the ``pos`` config group builds one per token stream with
  ``pos(max_len=..., d_model=..., n_heads=...)``, and ``grid=(rows, cols)`` for image patches): ``add`` puts a
  table onto the embeddings, ``attention`` is what every self-attention layer of that stream gets.
* :class:`AttentionPositions` is that attention-side part: ``rotate`` turns q and k (RoPE), ``score_bias`` adds
  to the scores (ALiBi). A new relative-position scheme is one subclass of it plus a :class:`Positions` wrapper.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..core.errors import ConfigError
from .settings import PositionSettings


def sinusoidal_table(max_len: int, dim: int) -> Tensor:
    """(max_len, dim): PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(...)."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(max_len, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table


def sinusoidal_table_2d(grid_h: int, grid_w: int, dim: int) -> Tensor:
    """(grid_h·grid_w, dim) in row-major patch order: channels [0, dim/2) encode the row, [dim/2, dim) the column."""
    if dim % 4:
        raise ConfigError(f"2-D sinusoidal positions need d_model divisible by 4, got {dim}")
    half = dim // 2
    rows = sinusoidal_table(grid_h, half)  # (gh, D/2)
    cols = sinusoidal_table(grid_w, half)  # (gw, D/2)
    return torch.cat([rows[:, None, :].expand(grid_h, grid_w, half),
                      cols[None, :, :].expand(grid_h, grid_w, half)], dim=-1).reshape(grid_h * grid_w, dim)


class Positions(nn.Module):
    """A token stream's positions; one constructor signature for every kind, so that a config group can build any
    of them as ``pos(max_len=..., d_model=..., n_heads=...)`` (plus ``grid=(rows, cols)`` for image patches).

    Base: adds nothing and gives attention nothing (that is ``none``).
    """

    def __init__(self, max_len: int, d_model: int, n_heads: int | None = None, *,
                 grid: tuple[int, int] | None = None):
        super().__init__()
        self.max_len, self.d_model, self.n_heads = max_len, d_model, n_heads
        self.grid = tuple(grid) if grid is not None else None

    def add(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D), the T tokens at positions ``offset`` .. ``offset + T - 1``."""
        return x

    @property
    def attention(self) -> AttentionPositions | None:
        """What every self-attention layer of this stream gets (None: nothing)."""
        return None


class NoPositions(Positions):
    """No position information: self-attention is then permutation-equivariant (claim E4)."""


class _TablePositions(Positions):
    """A (max_len, D) table added to the embeddings; ``forward(length, offset)`` returns its rows."""

    table: Tensor

    def rows(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.table.shape[0]:
            raise ValueError(f"position {offset + length} beyond the {type(self).__name__} table "
                             f"({self.table.shape[0]} rows)")
        return self.table[offset : offset + length]

    def forward(self, length: int, offset: int = 0) -> Tensor:
        return self.rows(length, offset)

    def add(self, x: Tensor, offset: int = 0) -> Tensor:
        return x + self.rows(x.shape[1], offset)


class SinusoidalPositions(_TablePositions):
    """Fixed sin/cos table (a non-persistent buffer: checkpoints hold nothing for it).

    With ``grid=(rows, cols)``: the 2-D table of the ViT (rows in the first half of the channels, columns in the
    second), preceded by ``max_len - rows·cols`` zero rows for the tokens before the patches (class token).
    ``SinusoidalPositions(max_len, dim)`` (no grid) is the 1-D table.
    """

    def __init__(self, max_len: int, d_model: int, n_heads: int | None = None, *,
                 grid: tuple[int, int] | None = None):
        super().__init__(max_len, d_model, n_heads, grid=grid)
        if self.grid is None:
            table = sinusoidal_table(max_len, d_model)
        else:
            rows, cols = self.grid
            if max_len < rows * cols:
                raise ConfigError(f"sinusoidal positions: max_len={max_len} is smaller than the {rows}x{cols} grid "
                                  f"of patches ({rows * cols}); max_len counts every token, patches included")
            table = torch.cat([torch.zeros(max_len - rows * cols, d_model), sinusoidal_table_2d(rows, cols, d_model)])
        self.register_buffer("table", table, persistent=False)


class LearnedPositions(_TablePositions):
    """A trained (max_len, D) table, parameter ``table``, initialised N(0, init_std²) (GPT-2, ViT). With a grid it
    is still one row per token in patch order (as in ViT); the grid is not used."""

    def __init__(self, max_len: int, d_model: int, n_heads: int | None = None, *,
                 grid: tuple[int, int] | None = None, init_std: float = 0.02):
        PositionSettings(kind="learned", init_std=init_std)
        super().__init__(max_len, d_model, n_heads, grid=grid)
        self.table = nn.Parameter(torch.randn(max_len, d_model) * init_std)


class AttentionPositions(nn.Module):
    """Position information that lives inside self-attention. :class:`~attnlab.modules.attention.MultiHeadAttention`
    calls ``rotate`` on q and k (after QK-norm, before the cache stores k) and adds ``score_bias`` to the scaled
    scores (merged into SDPA's float ``attn_mask``, so training stays on the fused kernel). Base: neither."""

    def rotate(self, q: Tensor, k: Tensor, offset: int = 0) -> tuple[Tensor, Tensor]:
        """q (B, H, T, Dh), k (B, H_kv, T, Dh): the T new positions ``offset`` .. ``offset + T - 1``."""
        return q, k

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, *, dtype: torch.dtype | None = None) -> Tensor | None:
        """(H, Tq, Tk) added to the scores of queries at absolute positions ``q_pos`` (Tq,) against keys at
        ``k_pos`` (Tk,), or None. Positions are absolute (KV-cache offset included); with a windowed cache the keys
        may come in ring-buffer order, which is why they are given one by one rather than as a range."""
        return None


class RotaryEmbedding(AttentionPositions):
    """Rotates pairs of channels of q and k by an angle proportional to the position (half-split layout)."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ConfigError(f"rotary positions need an even head dimension, got {head_dim}")
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

    def rotate(self, q: Tensor, k: Tensor, offset: int = 0) -> tuple[Tensor, Tensor]:
        return self(q, k, offset)


def alibi_slopes(n_heads: int) -> list[float]:
    """Press et al. 2022 (and their reference code): for n a power of two, the geometric sequence starting at
    2^(-8/n) with ratio 2^(-8/n), i.e. slope_h = 2^(-8h/n), h = 1..n. Otherwise the slopes of the closest power of
    two below n, followed by every other slope of the sequence for twice that power, until n slopes."""
    def power_of_two(n: int) -> list[float]:
        return [2 ** (-8 * h / n) for h in range(1, n + 1)]

    if n_heads < 1:
        raise ConfigError(f"ALiBi needs at least one head, got n_heads={n_heads}")
    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return slopes


class ALiBi(AttentionPositions):
    """ALiBi: head h adds ``-slope_h · |i - j|`` to the score of query position i against key position j (absolute
    positions, so a KV cache's offset and a sliding window's ring buffer need nothing special). No parameters; the
    slopes are a non-persistent buffer (checkpoints hold nothing for them)."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads), dtype=torch.float32), persistent=False)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, *, dtype: torch.dtype | None = None) -> Tensor:
        distance = (q_pos[:, None] - k_pos[None, :]).abs().to(self.slopes.dtype)  # (Tq, Tk)
        bias = -self.slopes[:, None, None] * distance  # (H, Tq, Tk)
        return bias.to(dtype) if dtype is not None else bias


class RotaryPositions(Positions):
    """RoPE: nothing added to the embeddings; every self-attention layer rotates q and k (one shared table)."""

    def __init__(self, max_len: int, d_model: int, n_heads: int, base: float = 10000.0, *,
                 grid: tuple[int, int] | None = None):
        settings = PositionSettings(kind="rotary", base=base)  # train.py's check and line (as are those below)
        settings.check_grid(grid)
        super().__init__(max_len, d_model, n_heads)
        head_dim = settings.check_sizes(d_model, n_heads)
        self.rotary = RotaryEmbedding(head_dim, max_len, base)

    @property
    def attention(self) -> RotaryEmbedding:
        return self.rotary


class ALiBiPositions(Positions):
    """ALiBi: nothing added to the embeddings; every self-attention layer adds the per-head distance penalty."""

    def __init__(self, max_len: int, d_model: int, n_heads: int, *, grid: tuple[int, int] | None = None):
        settings = PositionSettings(kind="alibi")
        settings.check_grid(grid)
        super().__init__(max_len, d_model, n_heads)
        settings.check_sizes(d_model, n_heads)
        self.alibi = ALiBi(n_heads)

    @property
    def attention(self) -> ALiBi:
        return self.alibi
