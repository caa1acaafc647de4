"""Attention-health metrics on maps whose answer is known, over sizes and heads: uniform rows have entropy 1 (causal
rows too: normalized by the keys each query may see) and one-hot rows 0; the sink is the weight on key 0; the mean
distance of a map that reads key j is |i - j| tokens, or the pixel distance between patch centres on a ViT grid (the
class token left out); a diagonal cross-attention has focus 1 and diagonality ~1, a uniform one focus 1/Tk."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnlab.analysis.attention_health import METRICS, attention_health, head_health, health_key, parse_health_key

SIZES = [(1, 2), (2, 5), (4, 11)]  # (heads, tokens)


def causal_uniform(h, t):
    w = torch.tril(torch.ones(t, t))
    return (w / w.sum(-1, keepdim=True)).expand(h, t, t).clone()


@pytest.mark.parametrize("h, t", SIZES)
def test_entropy_is_normalized_by_the_visible_keys(h, t):
    full = torch.full((h, t, t), 1.0 / t)
    assert torch.allclose(head_health(full)["entropy"], torch.ones(h))
    assert torch.allclose(head_health(causal_uniform(h, t))["entropy"], torch.ones(h), atol=1e-6)
    one_hot = torch.eye(t).expand(h, t, t).clone()
    assert torch.allclose(head_health(one_hot)["entropy"], torch.zeros(h))


@pytest.mark.parametrize("h, t", SIZES)
def test_sink_is_the_weight_on_the_first_key(h, t):
    w = torch.zeros(h, t, t)
    w[..., 0] = 1.0  # every query reads the first token only
    assert torch.allclose(head_health(w)["sink"], torch.ones(h))
    assert torch.allclose(head_health(torch.full((h, t, t), 1.0 / t))["sink"], torch.full((h,), 1.0 / t))


@pytest.mark.parametrize("ht, shift", itertools.product(SIZES, [0, 1, 2]))
def test_distance_in_tokens(ht, shift):
    h, t = ht
    w = torch.zeros(h, t, t)
    for i in range(t):
        w[:, i, max(0, i - shift)] = 1.0  # each query reads `shift` tokens back (or the first)
    want = sum(i - max(0, i - shift) for i in range(t)) / t
    assert torch.allclose(head_health(w)["distance"], torch.full((h,), float(want)))


@pytest.mark.parametrize("grid, prefix, patch_px", [(2, 0, 2.0), (3, 1, 4.0), (4, 1, 2.0)])
def test_distance_in_pixels_on_the_patch_grid(grid, prefix, patch_px):
    p = grid * grid
    t = p + prefix
    w = torch.zeros(1, t, t)
    for q in range(p):  # each patch reads its right neighbour (the last column reads itself), and the class token
        r, c = divmod(q, grid)
        k = r * grid + min(c + 1, grid - 1)
        w[0, prefix + q, prefix + k] = 0.5
        w[0, prefix + q, 0] += 0.5
    if prefix:
        w[0, 0, 0] = 1.0
    got = head_health(w, grid=grid, prefix=prefix, patch_px=patch_px)["distance"]
    moved = sum(1 for q in range(p) if q % grid < grid - 1)
    if prefix:  # the class token's share is left out and the rest renormalized: one neighbour per moving patch
        want = patch_px * moved / p
        assert torch.allclose(got[0], torch.tensor(want), atol=1e-5)
    else:  # no class token: half the weight is on patch 0, at its true distance
        assert got[0] > 0


@pytest.mark.parametrize("h, tq, tk", [(1, 12, 12), (2, 20, 10), (3, 12, 24)])
def test_cross_attention_focus_and_diagonality(h, tq, tk):
    diag = torch.zeros(h, tq, tk)
    for i in range(tq):
        diag[:, i, min(tk - 1, int(i * tk / tq))] = 1.0
    m = head_health(diag, cross=True)
    assert torch.allclose(m["focus_rate"], torch.ones(h))
    assert (m["diagonal_rate"] > 0.9).all() and "distance" not in m
    uniform = head_health(torch.full((h, tq, tk), 1.0 / tk), cross=True)
    assert torch.allclose(uniform["focus_rate"], torch.full((h,), 1.0 / tk))


def test_names_one_scheme_mean_and_per_head():
    """One key scheme for every module kind: ``health.<module>/<metric>[_h<k>]``; the part before the ``/`` (W&B's
    panel section) names the module, so each attention layer gets a section; every key parses back."""
    maps = {"net.decoder.layers.0.cross_attn": torch.full((1, 2, 3, 4), 0.25),
            "net.decoder.layers.0.self_attn": causal_uniform(2, 3)[None]}
    out = attention_health(maps)
    assert set(out) == {f"health.{n}/{m}{s}" for n, ms in
                        [("net.decoder.layers.0.cross_attn", ["entropy", "sink", "focus_rate", "diagonal_rate"]),
                         ("net.decoder.layers.0.self_attn", ["entropy", "sink", "distance"])]
                        for m in ms for s in ["", "_h0", "_h1"]}
    assert out["health.net.decoder.layers.0.cross_attn/focus_rate"] == pytest.approx(0.25)
    assert {k.split("/")[0] for k in out} == {f"health.{n}" for n in maps}
    for key in out:
        module, metric, head = parse_health_key(key)
        assert health_key(module, metric, head) == key and module in maps and metric in METRICS


@pytest.mark.parametrize("key", ["health/net.x/entropy", "val/loss", "health./entropy", "health.net.x/other",
                                 "health.net.x/entropy_hx", "health.net.x/a/entropy", "healthy.net.x/entropy"])
def test_other_keys_do_not_parse(key):
    assert parse_health_key(key) is None
