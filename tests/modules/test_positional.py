"""Positions: sinusoidal table, rotary embedding, learned table, the builder."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.modules.positional import (
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    sinusoidal_table,
)


@pytest.mark.parametrize("p", [0, 1, 7, 50])
def test_sinusoidal_table_matches_formula(p):
    dim = 16
    table = sinusoidal_table(64, dim)
    assert table.shape == (64, dim)
    for i in range(dim // 2):
        angle = p / 10000 ** (2 * i / dim)
        assert table[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
        assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_sinusoidal_odd_dim_and_module_slice():
    table = sinusoidal_table(10, 5)
    assert table.shape == (10, 5)
    assert table[3, 4].item() == pytest.approx(math.sin(3 / 10000 ** (4 / 5)), abs=1e-6)
    mod = SinusoidalPositions(10, 6)
    assert torch.equal(mod(3, offset=2), sinusoidal_table(10, 6)[2:5])
    assert len(list(mod.parameters())) == 0
    assert "table" not in mod.state_dict()  # not persistent


def test_rotary_preserves_norms():
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=16, max_len=64)
    q, k = torch.randn(2, 3, 10, 16), torch.randn(2, 3, 10, 16)
    rq, rk = rope(q, k, offset=5)
    assert not torch.allclose(rq, q)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rk.norm(dim=-1), k.norm(dim=-1), atol=1e-5, rtol=1e-5)


def test_rotary_position_zero_is_identity():
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, 16)
    q = torch.randn(1, 1, 1, 8)
    rq, _ = rope(q, q, offset=0)
    torch.testing.assert_close(rq, q)


def test_rotary_dot_product_depends_only_on_relative_position():
    torch.manual_seed(0)
    dh, n = 16, 12
    rope = RotaryEmbedding(dh, max_len=64)
    a, b = torch.randn(dh), torch.randn(dh)
    q = a.expand(1, 1, n, dh)
    k = b.expand(1, 1, n, dh)

    def scores(offset):
        rq, rk = rope(q, k, offset=offset)
        return rq[0, 0] @ rk[0, 0].T  # (n, n): q at offset+i against k at offset+j

    s0, s7 = scores(0), scores(7)
    torch.testing.assert_close(s0, s7, atol=1e-4, rtol=1e-5)  # shift both positions by the same amount
    # within one call, (i, j) and (i+s, j+s) give the same score
    torch.testing.assert_close(s0[:-3, :-3], s0[3:, 3:], atol=1e-4, rtol=1e-5)
    # but the score does change with the relative offset
    assert abs(s0[5, 5].item() - s0[5, 2].item()) > 1e-3


def test_rotary_errors():
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7, 16)
    rope = RotaryEmbedding(8, 4)
    x = torch.randn(1, 1, 3, 8)
    rope(x, x, offset=1)
    with pytest.raises(ValueError):
        rope(x, x, offset=2)


def test_learned_table_shape_and_range():
    torch.manual_seed(0)
    mod = LearnedPositions(12, 8)
    assert isinstance(mod.table, nn.Parameter)
    assert mod.table.shape == (12, 8)
    assert mod(4, offset=8).shape == (4, 8)
    assert torch.equal(mod(4, offset=8), mod.table[8:12])
    with pytest.raises(ValueError, match="beyond"):
        mod(5, offset=8)
    with pytest.raises(ValueError):
        mod(13)
