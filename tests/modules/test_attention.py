"""MultiHeadAttention: the fused (SDPA) and explicit paths, masks, causality, KV caches, attention capture."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.modules.attention import KVCache, MultiHeadAttention, capture_attention, causal_mask
from attnlab.modules.positional import RotaryEmbedding

B, T, D, H = 2, 7, 32, 4
ATOL = 1e-5


def make_attn(seed: int = 0, **kw) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(D, H, **kw).eval()


def both_paths(attn: MultiHeadAttention, *args, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    fast = attn(*args, **kw)
    slow = attn(*args, need_weights=True, **kw)
    return fast, slow


def padding_mask(lengths: list[int], total: int) -> torch.Tensor:
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]


# --------------------------------------------------------------------------- paths agree


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_self_attention_paths_agree(is_causal):
    attn = make_attn()
    x = torch.randn(B, T, D)
    fast, slow = both_paths(attn, x, is_causal=is_causal)
    assert fast.shape == (B, T, D)
    torch.testing.assert_close(fast, slow, atol=ATOL, rtol=0)


def test_self_attention_paths_agree_with_padding_and_causal():
    attn = make_attn()
    x = torch.randn(B, T, D)
    kpm = padding_mask([T, 4], T)
    fast, slow = both_paths(attn, x, key_padding_mask=kpm, is_causal=True)
    torch.testing.assert_close(fast, slow, atol=ATOL, rtol=0)


def test_cross_attention_paths_agree_with_key_padding():
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, kv_dim=24).eval()
    x, ctx = torch.randn(B, 5, D), torch.randn(B, 9, 24)
    kpm = padding_mask([9, 3], 9)
    fast, slow = both_paths(attn, x, ctx, key_padding_mask=kpm)
    assert fast.shape == (B, 5, D)
    torch.testing.assert_close(fast, slow, atol=ATOL, rtol=0)
    assert attn.weights.shape == (B, H, 5, 9)


def test_paths_agree_with_explicit_attn_mask():
    attn = make_attn()
    x = torch.randn(B, T, D)
    torch.manual_seed(1)
    mask = torch.rand(B, 1, T, T) > 0.4
    mask |= torch.eye(T, dtype=torch.bool)  # every query keeps at least one key
    fast, slow = both_paths(attn, x, attn_mask=mask)
    torch.testing.assert_close(fast, slow, atol=ATOL, rtol=0)
    # the mask is honoured: masked-out weights are exactly zero
    assert torch.all(attn.weights.masked_select(~mask.expand(B, H, T, T)) == 0)
    # and it matters: the unmasked output differs
    assert not torch.allclose(fast, attn(x), atol=1e-4)


# --------------------------------------------------------------------------- causality


@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rotary"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
def test_causal_outputs_ignore_the_future(rotary, need_weights):
    attn = make_attn(positions=RotaryEmbedding(D // H, 32) if rotary else None)
    x = torch.randn(B, T, D)
    t = 3
    x2 = x.clone()
    x2[:, t + 1 :] = torch.randn(B, T - t - 1, D)
    y1 = attn(x, is_causal=True, need_weights=need_weights)
    y2 = attn(x2, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(y1[:, : t + 1], y2[:, : t + 1], atol=ATOL, rtol=0)
    assert not torch.allclose(y1[:, t + 1 :], y2[:, t + 1 :], atol=1e-3)


def test_causal_weights_are_lower_triangular():
    attn = make_attn()
    attn(torch.randn(B, T, D), is_causal=True, need_weights=True)
    upper = ~torch.tril(torch.ones(T, T, dtype=torch.bool))
    assert torch.all(attn.weights[..., upper] == 0)
    assert torch.all(attn.weights[..., ~upper] > 0)


def test_causal_mask_is_aligned_to_last_key():
    m = causal_mask(2, 5)
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)
    assert torch.equal(causal_mask(4, 4), torch.tril(torch.ones(4, 4, dtype=torch.bool)))


# --------------------------------------------------------------------------- padding and weights


def test_padding_keys_get_zero_weight_and_their_values_do_not_matter():
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, kv_dim=D).eval()
    x, ctx = torch.randn(B, 5, D), torch.randn(B, 8, D)
    kpm = padding_mask([8, 5], 8)
    y = attn(x, ctx, key_padding_mask=kpm, need_weights=True)
    w = attn.weights
    assert torch.all(w[1, :, :, 5:] == 0)
    assert torch.all(w[1, :, :, :5] > 0)
    assert torch.all(w[0] > 0)
    ctx2 = ctx.clone()
    ctx2[1, 5:] = 100 * torch.randn(3, D)
    for need_weights in (False, True):
        y2 = attn(x, ctx2, key_padding_mask=kpm, need_weights=need_weights)
        torch.testing.assert_close(y, y2, atol=ATOL, rtol=0)
    # control: without the mask the padded keys do change the output
    assert not torch.allclose(attn(x, ctx, ), attn(x, ctx2), atol=1e-3)


def test_fully_masked_query_row_paths_agree():
    attn = make_attn()
    x = torch.randn(1, 3, D)
    left_padded = torch.tensor([[False, True, True]])  # query 0 may only see key 0, which is padding
    fast, slow = both_paths(attn, x, key_padding_mask=left_padded, is_causal=True)
    assert torch.isfinite(fast).all()
    assert torch.isfinite(slow).all()
    torch.testing.assert_close(fast, slow, atol=ATOL, rtol=0)


def test_weights_rows_sum_to_one():
    attn = make_attn()
    attn(torch.randn(B, T, D), key_padding_mask=padding_mask([T, 3], T), is_causal=True, need_weights=True)
    w = attn.weights
    assert w.shape == (B, H, T, T)
    assert torch.all(w >= 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T), atol=1e-6, rtol=0)


def test_self_attention_without_positions_is_permutation_equivariant():
    attn = make_attn()
    x = torch.randn(B, T, D)
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(perm, torch.arange(T))
    y = attn(x)
    torch.testing.assert_close(attn(x[:, perm]), y[:, perm], atol=ATOL, rtol=0)


def test_rotary_breaks_permutation_equivariance():
    attn = make_attn(positions=RotaryEmbedding(D // H, 32))
    x = torch.randn(B, T, D)
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(3))
    assert not torch.allclose(attn(x[:, perm]), attn(x)[:, perm], atol=1e-4)


# --------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rotary"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
def test_kv_cache_incremental_equals_full_causal_pass(rotary, need_weights):
    attn = make_attn(positions=RotaryEmbedding(D // H, 32) if rotary else None)
    x = torch.randn(B, T, D)
    full = attn(x, is_causal=True)
    cache = KVCache(B, H, D // H, max_len=16)
    prefix = 3
    steps = [attn(x[:, :prefix], is_causal=True, kv_cache=cache, need_weights=need_weights)]
    for t in range(prefix, T):
        steps.append(attn(x[:, t : t + 1], is_causal=True, kv_cache=cache, need_weights=need_weights))
    assert cache.length == T
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)


def test_kv_cache_chunk_after_prefix_uses_shifted_causal_mask():
    attn = make_attn(positions=RotaryEmbedding(D // H, 32))
    x = torch.randn(B, T, D)
    full = attn(x, is_causal=True)
    cache = KVCache(B, H, D // H, max_len=T)
    a = attn(x[:, :2], is_causal=True, kv_cache=cache)
    b = attn(x[:, 2:], is_causal=True, kv_cache=cache)  # a chunk of 5 queries over 7 keys
    torch.testing.assert_close(torch.cat([a, b], 1), full, atol=ATOL, rtol=0)


def test_kv_cache_reorder_selects_rows():
    cache = KVCache(3, H, 2, max_len=4)
    k = torch.arange(3.0)[:, None, None, None].expand(3, H, 2, 2).clone()
    cache.append(k, -k)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.k.shape == (3, H, 4, 2)
    assert torch.equal(cache.k[:, 0, 0, 0], torch.tensor([2.0, 2.0, 0.0]))
    assert torch.equal(cache.v[:, 0, 1, 1], torch.tensor([-2.0, -2.0, 0.0]))
    assert cache.length == 2
    ks, vs = cache.append(torch.ones(3, H, 1, 2), torch.ones(3, H, 1, 2))
    assert ks.shape == (3, H, 3, 2)
    assert torch.equal(ks[:, 0, 0, 0], torch.tensor([2.0, 2.0, 0.0]))


def test_kv_cache_reorder_in_attention_matches_reordered_batch():
    attn = make_attn()
    x = torch.randn(3, 5, D)
    cache = KVCache(3, H, D // H, max_len=8)
    attn(x[:, :4], is_causal=True, kv_cache=cache)
    idx = torch.tensor([1, 1, 2])
    cache.reorder(idx)
    step = attn(x[idx, 4:5], is_causal=True, kv_cache=cache)
    torch.testing.assert_close(step, attn(x[idx], is_causal=True)[:, 4:5], atol=ATOL, rtol=0)


def test_kv_cache_overflow_raises():
    cache = KVCache(1, 1, 2, max_len=3)
    cache.append(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    with pytest.raises(ValueError, match="KV cache full"):
        cache.append(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    attn = make_attn()
    with pytest.raises(ValueError):
        attn(torch.randn(1, 5, D), is_causal=True, kv_cache=KVCache(1, H, D // H, max_len=4))


def test_cross_attention_cache_filled_once_and_reused():
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, kv_dim=16).eval()
    x, ctx = torch.randn(B, 4, D), torch.randn(B, 6, 16)
    kpm = padding_mask([6, 4], 6)
    cache = KVCache(B, H, D // H, max_len=6)
    outs = []
    for t in range(4):
        outs.append(attn(x[:, t : t + 1], ctx if t == 0 else None, key_padding_mask=kpm, kv_cache=cache))
        assert cache.length == 6  # filled on the first call, not appended again
    ref = attn(x, ctx, key_padding_mask=kpm)
    torch.testing.assert_close(torch.cat(outs, 1), ref, atol=ATOL, rtol=0)
    # passing the context again with a filled cache still reuses the cache
    ctx_other = torch.randn(B, 6, 16)
    torch.testing.assert_close(attn(x, ctx_other, key_padding_mask=kpm, kv_cache=cache), ref, atol=ATOL, rtol=0)


def test_cross_attention_without_context_raises():
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, kv_dim=16)
    with pytest.raises(ValueError, match="context"):
        attn(torch.randn(1, 2, D))


# --------------------------------------------------------------------------- capture, switches, checks


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = MultiHeadAttention(D, H)
        self.inner = nn.ModuleDict({"cross": MultiHeadAttention(D, 2, kv_dim=D)})

    def forward(self, x, ctx):
        h = x + self.first(x, is_causal=True)
        return h + self.inner["cross"](h, ctx)


def test_capture_attention_maps_and_restore():
    model = TwoLayer().eval()
    x, ctx = torch.randn(B, 5, D), torch.randn(B, 3, D)
    outside = model(x, ctx)
    with capture_attention(model) as maps:
        assert model.first.return_weights and model.inner["cross"].return_weights
        inside = model(x, ctx)
        assert len(maps) == 0  # filled at exit
    assert set(maps) == {"first", "inner.cross"}
    assert maps["first"].shape == (B, H, 5, 5)
    assert maps["inner.cross"].shape == (B, 2, 5, 3)
    assert not maps["first"].requires_grad
    torch.testing.assert_close(maps["first"].sum(-1), torch.ones(B, H, 5), atol=1e-6, rtol=0)
    torch.testing.assert_close(inside, outside, atol=ATOL, rtol=0)
    for m in (model.first, model.inner["cross"]):
        assert m.return_weights is False
        assert m.weights is None


def test_capture_attention_restores_on_exception():
    model = TwoLayer()
    with pytest.raises(RuntimeError):
        with capture_attention(model):
            raise RuntimeError("boom")
    assert model.first.return_weights is False


def test_unscaled_switch_changes_outputs():
    scaled = make_attn()
    unscaled = make_attn(scaled=False)
    unscaled.load_state_dict(scaled.state_dict())
    assert unscaled.scale == 1.0 and scaled.scale == pytest.approx((D // H) ** -0.5)
    x = torch.randn(B, T, D)
    assert not torch.allclose(scaled(x), unscaled(x), atol=1e-4)
    fast, slow = both_paths(unscaled, x, is_causal=True)
    torch.testing.assert_close(fast, slow, atol=ATOL, rtol=0)


def test_d_model_not_divisible_by_heads_raises():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(30, 4)
