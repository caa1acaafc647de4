"""Guided attention loss (claim C25) and the alignment measures, on attention matrices whose answer is known."""

from __future__ import annotations

import pytest
import torch

from attnlab.modules.guided_attention import (diagonal_rate, focus_rate, guided_attention_loss,
                                              guided_attention_weights, skips_and_repeats)


def one_hot_diagonal(t: int, n: int) -> torch.Tensor:
    """(T, N): step t attends only to character round(t·N/T)."""
    idx = torch.clamp((torch.arange(t) * n / t).round().long(), max=n - 1)
    return torch.nn.functional.one_hot(idx, n).float()


def lens(*values: int) -> torch.Tensor:
    return torch.tensor(values)


def test_identity_attention_costs_exactly_zero():
    for n in (1, 5, 17):
        a = torch.eye(n)[None, None]  # (1, 1, T=N, N)
        assert guided_attention_loss(a, lens(n), lens(n)).item() == 0.0


@pytest.mark.parametrize("t,n", [(40, 7), (7, 40), (64, 23), (100, 100), (9, 3)])
def test_near_zero_on_the_diagonal_and_large_off_it(t, n):
    diag = one_hot_diagonal(t, n)[None, None]
    anti = diag.flip(-1)
    uniform = torch.full((1, 1, t, n), 1.0 / n)
    d, a, u = (guided_attention_loss(x, lens(n), lens(t)).item() for x in (diag, anti, uniform))
    # the loss is a mean over all T·N cells, so a one-hot row contributes 1/N of its penalty: compare, don't fix
    # absolute levels. Near zero: under 15% of what uniform attention costs (under 1% once N ≥ 10).
    assert d < 0.15 * u and (n < 10 or d < 0.01 * u), (d, u)
    assert u < a


def test_grows_as_the_attention_moves_off_the_diagonal():
    t, n = 60, 30
    base = one_hot_diagonal(t, n)
    losses = [guided_attention_loss(torch.roll(base, s, dims=1)[None, None], lens(n), lens(t)).item()
              for s in (0, 3, 6, 12)]  # shift every step's character by s (no wrap-around for most rows)
    assert losses == sorted(losses) and losses[-1] > 10 * max(losses[0], 1e-4)


def test_sigma_sets_the_width_of_the_free_band():
    t, n = 50, 50
    shifted = torch.roll(torch.eye(n), 5, dims=1)[None, None]
    narrow = guided_attention_loss(shifted, lens(n), lens(t), sigma=0.2).item()
    wide = guided_attention_loss(shifted, lens(n), lens(t), sigma=0.4).item()
    assert narrow > wide > 0


def test_padding_is_ignored_and_lengths_are_per_utterance():
    # utterance 0: 20 steps × 10 chars; utterance 1: 12 steps × 3 chars, padded to 20 × 10
    a = torch.zeros(2, 2, 20, 10)
    a[0, :] = one_hot_diagonal(20, 10)
    a[1, :, :12, :3] = one_hot_diagonal(12, 3)
    tl, dl = lens(10, 3), lens(20, 12)
    clean = guided_attention_loss(a, tl, dl)
    noisy = a.clone()
    noisy[1, :, 12:, :] = 1.0  # padded decoder steps
    noisy[1, :, :, 3:] = 1.0  # padded characters
    assert torch.equal(guided_attention_loss(noisy, tl, dl), clean)
    # the penalty of utterance 1 is built on ITS lengths: equal to the one built for it alone
    w = guided_attention_weights(tl, dl, 20, 10)
    alone = guided_attention_weights(lens(3), lens(12), 12, 3)
    assert torch.allclose(w[1, :12, :3], alone[0]) and (w[1, 12:] == 0).all() and (w[1, :, 3:] == 0).all()
    # judged on the batch's padded size instead, utterance 1's diagonal would look off-diagonal
    as_padded = guided_attention_weights(lens(10), lens(20), 20, 10)[0]
    assert (a[1, 0] * as_padded).sum() > 1.5 * (a[1, 0] * w[1]).sum()
    # mean over valid cells and heads: a constant attention c gives c · mean(W over valid cells)
    c = torch.full((2, 2, 20, 10), 0.3)
    expected = 0.3 * w.sum() / (20 * 10 + 12 * 3)
    assert torch.allclose(guided_attention_loss(c, tl, dl), expected)


def test_list_of_layers_pools_heads():
    a = one_hot_diagonal(30, 10)[None, None].expand(1, 2, 30, 10)
    b = torch.full((1, 2, 30, 10), 0.1)
    both = guided_attention_loss([a, b], lens(10), lens(30))
    assert torch.allclose(both, (guided_attention_loss(a, lens(10), lens(30))
                                 + guided_attention_loss(b, lens(10), lens(30))) / 2)


def test_focus_and_diagonal_rates():
    t, n = 40, 10
    diag = one_hot_diagonal(t, n)[None, None]
    uniform = torch.full((1, 1, t, n), 1.0 / n)
    assert focus_rate(diag, lens(n), lens(t)).item() == pytest.approx(1.0)
    assert focus_rate(uniform, lens(n), lens(t)).item() == pytest.approx(1.0 / n)
    assert diagonal_rate(diag, lens(n), lens(t)).item() > 0.95
    assert diagonal_rate(uniform, lens(n), lens(t)).item() == pytest.approx(0.2, abs=0.06)  # ~2·band
    assert diagonal_rate(diag.flip(-1), lens(n), lens(t)).item() < 0.2
    # padded steps do not count
    padded = torch.cat([diag, torch.zeros(1, 1, 10, n)], dim=2)
    assert focus_rate(padded, lens(n), lens(t)).item() == pytest.approx(1.0)


def test_skips_and_repeats_follow_the_argmax_path():
    t, n = 30, 15
    good = one_hot_diagonal(t, n)[None]
    assert skips_and_repeats(good, n, t) == (0, 0)
    path = list(range(0, 5)) + list(range(10, 15))  # jumps from 4 to 10: skips 5 characters
    skipping = torch.nn.functional.one_hot(torch.tensor(path), n).float()[None]
    assert skips_and_repeats(skipping, n, len(path)) == (5, 0)
    path = list(range(0, 10)) + list(range(3, 15))  # goes back from 9 to 3: one repeat
    repeating = torch.nn.functional.one_hot(torch.tensor(path), n).float()[None]
    assert skips_and_repeats(repeating, n, len(path)) == (0, 1)
    early = torch.nn.functional.one_hot(torch.arange(8), n).float()[None]  # stops at character 7 of 15
    assert skips_and_repeats(early, n, 8)[0] == 15 - 1 - 7 - 3
