"""Attention variants: grouped-query / multi-query attention, QK-norm, sliding window, ALiBi and RoPE
through ``positions=``; the KV cache of each; that training stays on SDPA; the refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.core.errors import ConfigError, UserError
from attnlab.modules.attention import KVCache, MultiHeadAttention
from attnlab.modules.positional import ALiBi, RotaryEmbedding

B, T, D, H = 3, 9, 32, 4
DH = D // H
ATOL = 1e-5


def padding_mask(lengths: list[int], total: int) -> torch.Tensor:
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]


def make_positions(kind: str, n_heads: int = H, max_len: int = 64):
    return {"none": None, "rotary": RotaryEmbedding(D // n_heads, max_len), "alibi": ALiBi(n_heads)}[kind]


def make(seed: int = 0, **kw) -> MultiHeadAttention:
    torch.manual_seed(seed)
    attn = MultiHeadAttention(D, H, **kw).eval()
    with torch.no_grad():  # biases random too, so that a wrongly split bias cannot hide behind zeros
        for m in attn.modules():
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                m.bias.normal_()
    return attn


def repeated_kv_mha(gqa: MultiHeadAttention) -> MultiHeadAttention:
    """A plain multi-head layer whose K/V projections are the GQA ones repeated for every query head of a group."""
    group = gqa.n_heads // gqa.kv_heads
    kvw = gqa.kv_heads * gqa.head_dim
    mha = MultiHeadAttention(gqa.d_model, gqa.n_heads, kv_dim=gqa.kv_proj.in_features if gqa.is_cross else None,
                             qk_norm=gqa.qk_norm, window=gqa.window, positions=gqa.positions).eval()

    def rep(t: torch.Tensor) -> torch.Tensor:  # (kv_heads·Dh, ...) -> (n_heads·Dh, ...), head by head
        return t.reshape(gqa.kv_heads, gqa.head_dim, *t.shape[1:]).repeat_interleave(group, 0).flatten(0, 1)

    sd = {k: v for k, v in gqa.state_dict().items() if not k.startswith(("qkv_proj", "kv_proj"))}
    for name in ("weight", "bias"):
        if gqa.is_cross:
            k, v = getattr(gqa.kv_proj, name).split(kvw)
            sd[f"kv_proj.{name}"] = torch.cat([rep(k), rep(v)])
        else:
            q, k, v = getattr(gqa.qkv_proj, name).split((gqa.d_model, kvw, kvw))
            sd[f"qkv_proj.{name}"] = torch.cat([q, rep(k), rep(v)])
    mha.load_state_dict(sd)
    return mha


# --------------------------------------------------------------------------- GQA / MQA


def test_kv_heads_equal_to_heads_is_todays_multi_head_attention():
    a, b = make(), make(kv_heads=H)
    assert {k: v.shape for k, v in a.state_dict().items()} == {
        "qkv_proj.weight": (3 * D, D), "qkv_proj.bias": (3 * D,), "out_proj.weight": (D, D), "out_proj.bias": (D,)}
    assert a.state_dict().keys() == b.state_dict().keys()
    b.load_state_dict(a.state_dict())
    x = torch.randn(B, T, D)
    kpm = padding_mask([T, 5, 2], T)
    for need_weights in (False, True):
        assert torch.equal(a(x, key_padding_mask=kpm, is_causal=True, need_weights=need_weights),
                           b(x, key_padding_mask=kpm, is_causal=True, need_weights=need_weights))
    cross = MultiHeadAttention(D, H, kv_dim=24)
    assert {k: v.shape for k, v in cross.state_dict().items()}["kv_proj.weight"] == (2 * D, 24)


@pytest.mark.parametrize("kv_heads", [1, 2], ids=["mqa", "gqa2"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
@pytest.mark.parametrize("positions", ["none", "rotary", "alibi"])
def test_gqa_self_attention_equals_mha_with_repeated_kv_weights(kv_heads, need_weights, positions):
    gqa = make(kv_heads=kv_heads, positions=make_positions(positions))
    assert gqa.qkv_proj.weight.shape == (D + 2 * kv_heads * DH, D)
    mha = repeated_kv_mha(gqa)
    x = torch.randn(B, T, D)
    kpm = padding_mask([T, 6, 1], T)
    for causal in (False, True):
        got = gqa(x, key_padding_mask=kpm, is_causal=causal, need_weights=need_weights)
        want = mha(x, key_padding_mask=kpm, is_causal=causal, need_weights=need_weights)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        if need_weights:
            assert gqa.weights.shape == (B, H, T, T)
            torch.testing.assert_close(gqa.weights, mha.weights, atol=1e-6, rtol=0)
    if kv_heads == 2:  # control: the grouping matters; query heads 0, 1 share K/V head 0 and heads 2, 3 head 1
        with torch.no_grad():
            w = mha.qkv_proj.weight.view(3, H, DH, D)
            w[1:, [1, 2]] = w[1:, [2, 1]].clone()  # give query head 1 the other group's K/V
        assert not torch.allclose(gqa(x, is_causal=True), mha(x, is_causal=True), atol=1e-4)


@pytest.mark.parametrize("kv_heads", [1, 2], ids=["mqa", "gqa2"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
def test_gqa_cross_attention_equals_mha_with_repeated_kv_weights(kv_heads, need_weights):
    torch.manual_seed(0)
    gqa = MultiHeadAttention(D, H, kv_dim=24, kv_heads=kv_heads).eval()
    assert gqa.kv_proj.weight.shape == (2 * kv_heads * DH, 24)
    mha = repeated_kv_mha(gqa)
    x, ctx = torch.randn(B, 5, D), torch.randn(B, 8, 24)
    kpm = padding_mask([8, 3, 6], 8)
    got = gqa(x, ctx, key_padding_mask=kpm, need_weights=need_weights)
    torch.testing.assert_close(got, mha(x, ctx, key_padding_mask=kpm, need_weights=need_weights), atol=ATOL, rtol=0)
    # a cross-attention cache filled once holds kv_heads heads and gives the same output
    cache = gqa.new_cache(B, 8)
    assert cache.k.shape == (B, kv_heads, 8, DH)
    steps = [gqa(x[:, t : t + 1], ctx if t == 0 else None, key_padding_mask=kpm, kv_cache=cache) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), got, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kv_heads", [H, 2, 1], ids=["mha", "gqa2", "mqa"])
def test_kv_cache_holds_kv_heads_and_shrinks_by_the_group(kv_heads):
    attn = make(kv_heads=kv_heads)
    cache = attn.new_cache(2, 50)
    full = make().new_cache(2, 50)
    assert cache.k.shape == cache.v.shape == (2, kv_heads, 50, DH)
    assert cache.nbytes * (H // kv_heads) == full.nbytes == 2 * 2 * H * 50 * DH * 4


# --------------------------------------------------------------------------- cached decoding = full recompute

VARIANTS = [(kv, pos, win) for kv in (H, 2, 1) for pos in ("none", "rotary", "alibi") for win in (None, 4)]


def _decode(attn, x, cache, prefill, chunk_at=None, need_weights=False):
    """Prefill ``prefill`` positions, then one token per step (a 3-token chunk at ``chunk_at``)."""
    outs = [attn(x[:, :prefill], is_causal=True, kv_cache=cache, need_weights=need_weights)]
    t = prefill
    while t < x.shape[1]:
        n = 3 if t == chunk_at else 1
        outs.append(attn(x[:, t : t + n], is_causal=True, kv_cache=cache, need_weights=need_weights))
        t += n
    return torch.cat(outs, 1)


@pytest.mark.parametrize("kv_heads,positions,window", VARIANTS,
                         ids=[f"kv{kv}-{pos}-w{win}" for kv, pos, win in VARIANTS])
def test_cached_decoding_equals_full_recompute(kv_heads, positions, window):
    attn = make(kv_heads=kv_heads, positions=make_positions(positions), window=window)
    n = 14
    x = torch.randn(B, n, D)
    full = attn(x, is_causal=True)
    # prefill longer than the window, then single steps, then a chunk of 3 after the ring has wrapped
    cache = attn.new_cache(B, 32)
    assert cache.k.shape[2] == (32 if window is None else window)  # memory: the window, not max_len
    torch.testing.assert_close(_decode(attn, x, cache, prefill=6, chunk_at=9), full, atol=ATOL, rtol=0)
    assert cache.length == n  # the next position offset, also for a windowed cache that holds only 4
    # the explicit path over the same cache layout
    cache = attn.new_cache(B, 32)
    torch.testing.assert_close(_decode(attn, x, cache, prefill=2, need_weights=True), full, atol=ATOL, rtol=0)
    assert attn.weights.shape == (B, H, 1, min(n, window or n))


@pytest.mark.parametrize("kv_heads,positions,window", [(2, "alibi", 4), (1, "rotary", 3), (H, "none", None)])
def test_cached_decoding_after_beam_reorder(kv_heads, positions, window):
    attn = make(kv_heads=kv_heads, positions=make_positions(positions), window=window)
    x = torch.randn(B, 12, D)
    cache = attn.new_cache(B, 16)
    _decode(attn, x[:, :7], cache, prefill=5)  # wrapped once for the windowed ones
    idx = torch.tensor([2, 0, 2])
    cache.reorder(idx)
    steps = [attn(x[idx, t : t + 1], is_causal=True, kv_cache=cache) for t in range(7, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), attn(x[idx], is_causal=True)[:, 7:], atol=ATOL, rtol=0)


def test_windowed_cache_with_padding_mask_over_all_positions():
    """A left-padded row: the padding mask covers every position so far, also once the ring dropped some."""
    attn = make(kv_heads=2, positions=ALiBi(H), window=5)
    x = torch.randn(B, 11, D)
    kpm = padding_mask([11, 11, 11], 11)
    kpm[1, :3] = False  # row 1 starts with three pads
    full = attn(x, key_padding_mask=kpm, is_causal=True)
    cache = attn.new_cache(B, 16)
    outs = [attn(x[:, :7], key_padding_mask=kpm[:, :7], is_causal=True, kv_cache=cache)]
    outs += [attn(x[:, t : t + 1], key_padding_mask=kpm[:, : t + 1], is_causal=True, kv_cache=cache)
             for t in range(7, 11)]
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=ATOL, rtol=0)


def test_window_at_least_max_len_is_a_plain_cache():
    attn = make(window=8)
    cache = attn.new_cache(B, 6)
    assert cache.window is None and cache.k.shape[2] == 6
    x = torch.randn(B, 6, D)
    torch.testing.assert_close(_decode(attn, x, cache, prefill=2), attn(x, is_causal=True), atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="KV cache full"):
        attn(x[:, :1], is_causal=True, kv_cache=cache)


def test_ring_buffer_slots_and_positions():
    cache = KVCache(1, 1, 1, max_len=10, window=3)
    assert cache.max_len == 3
    for p in range(5):
        cache.append(torch.full((1, 1, 1, 1), float(p)), torch.zeros(1, 1, 1, 1))
    # positions 2, 3, 4 kept; position p in slot p % 3
    assert cache.k.flatten().tolist() == [3.0, 4.0, 2.0]
    assert cache.key_order.tolist() == [3, 4, 2] and cache.length == 5 and cache.stored == 3
    ks, _ = cache.append(torch.tensor([5.0, 6.0]).view(1, 1, 2, 1), torch.zeros(1, 1, 2, 1))
    assert ks.flatten().tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]  # a chunk sees the held keys in order, then its own
    assert cache.key_order is None
    assert sorted(cache.k.flatten().tolist()) == [4.0, 5.0, 6.0]


# --------------------------------------------------------------------------- window semantics


def band(n: int, window: int, causal: bool) -> torch.Tensor:
    """The window written out position by position."""
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            m[i, j] = (i - window < j <= i) if causal else abs(i - j) < window
    return m


@pytest.mark.parametrize("window", [3, T - 1], ids=["w3", "one-pair-outside"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
def test_window_equals_a_hand_written_band_mask(window, causal, need_weights):
    win = make(window=window, kv_heads=2)
    ref = make(kv_heads=2)  # same seed, same weights, no window
    x = torch.randn(B, T, D)
    kpm = padding_mask([T, T, 4], T)
    got = win(x, key_padding_mask=kpm, is_causal=causal, need_weights=need_weights)
    want = ref(x, attn_mask=band(T, window, causal), key_padding_mask=kpm, is_causal=causal,
               need_weights=need_weights)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # the window bites (with W = T - 1 only on the first/last position of the unpadded rows)
    assert not torch.allclose(got, ref(x, key_padding_mask=kpm, is_causal=causal), atol=1e-4)
    if need_weights:
        assert torch.all(win.weights[..., ~band(T, window, causal)] == 0)


@pytest.mark.parametrize("positions", ["none", "alibi"])
def test_paths_agree_with_fully_masked_row(positions):
    attn = make(positions=make_positions(positions), window=2, kv_heads=2)
    x = torch.randn(1, 4, D)
    kpm = torch.tensor([[False, True, True, True]])  # query 0 may only see key 0, which is padding
    fast = attn(x, key_padding_mask=kpm, is_causal=True)
    slow = attn(x, key_padding_mask=kpm, is_causal=True, need_weights=True)
    assert torch.isfinite(fast).all() and torch.isfinite(slow).all()
    torch.testing.assert_close(fast, slow, atol=ATOL, rtol=0)


# --------------------------------------------------------------------------- QK-norm


def test_qk_norm_adds_exactly_two_gains():
    plain, normed = make(), make(qk_norm=True)
    assert not hasattr(plain, "q_norm") and not hasattr(plain, "k_norm")
    assert isinstance(normed.q_norm, torch.nn.RMSNorm) and normed.q_norm.normalized_shape == (DH,)
    extra = set(normed.state_dict()) - set(plain.state_dict())
    assert extra == {"q_norm.weight", "k_norm.weight"} and set(plain.state_dict()) <= set(normed.state_dict())
    assert normed.state_dict()["k_norm.weight"].shape == (DH,)
    normed.load_state_dict({**plain.state_dict(), "q_norm.weight": torch.ones(DH), "k_norm.weight": torch.ones(DH)})
    x = torch.randn(B, T, D)
    assert not torch.allclose(normed(x), plain(x), atol=1e-4)  # it does change the scores


def _rms(t: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + torch.finfo(t.dtype).eps) * gain


@pytest.mark.parametrize("kv_heads", [H, 2])
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
def test_qk_norm_equals_normalizing_q_and_k_by_hand_before_rotary(kv_heads, need_weights):
    rope = RotaryEmbedding(DH, 32)
    attn = make(qk_norm=True, kv_heads=kv_heads, positions=rope)
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
        attn.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(B, T, D)
    kvw = kv_heads * DH
    q, k, v = F.linear(x, attn.qkv_proj.weight, attn.qkv_proj.bias).split((D, kvw, kvw), -1)
    q = q.view(B, T, H, DH).transpose(1, 2)
    k = k.view(B, T, kv_heads, DH).transpose(1, 2).repeat_interleave(H // kv_heads, 1)
    v = v.view(B, T, kv_heads, DH).transpose(1, 2).repeat_interleave(H // kv_heads, 1)
    q, k = rope(_rms(q, attn.q_norm.weight), _rms(k, attn.k_norm.weight))  # norm first, then rotate
    scores = (q @ k.transpose(-1, -2)) / DH**0.5
    scores = scores.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
    want = F.linear(out, attn.out_proj.weight, attn.out_proj.bias)
    torch.testing.assert_close(attn(x, is_causal=True, need_weights=need_weights), want, atol=ATOL, rtol=0)


def test_qk_norm_gains_learn():
    attn = make(qk_norm=True, kv_heads=2).train()
    attn(torch.randn(B, T, D), is_causal=True).pow(2).sum().backward()
    assert attn.q_norm.weight.grad.abs().sum() > 0 and attn.k_norm.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------- training stays on SDPA

TRAIN_VARIANTS = {
    "mha": {}, "gqa": {"kv_heads": 2}, "mqa": {"kv_heads": 1}, "qk_norm": {"qk_norm": True},
    "window": {"window": 3}, "alibi": {"positions": "alibi"}, "rotary": {"positions": "rotary"},
    "all": {"kv_heads": 2, "qk_norm": True, "window": 3, "positions": "alibi"},
}


@pytest.mark.parametrize("variant", list(TRAIN_VARIANTS))
def test_training_forward_stays_on_sdpa(variant, monkeypatch):
    kw = dict(TRAIN_VARIANTS[variant])
    if "positions" in kw:
        kw["positions"] = make_positions(kw["positions"])
    attn = make(dropout=0.1, **kw).train()
    calls, explicit = [], []
    real_sdpa, real_explicit = F.scaled_dot_product_attention, MultiHeadAttention._explicit

    def counting_sdpa(*args, **kwargs):  # the real kernel runs; only the call is recorded
        calls.append(kwargs)
        return real_sdpa(*args, **kwargs)

    def counting_explicit(self, *args, **kwargs):
        explicit.append(1)
        return real_explicit(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_sdpa)
    monkeypatch.setattr(MultiHeadAttention, "_explicit", counting_explicit)
    x = torch.randn(B, T, D, requires_grad=True)
    for causal in (True, False):
        attn(x, key_padding_mask=padding_mask([T, 5, 3], T), is_causal=causal).sum().backward()
    assert len(calls) == 2 and not explicit
    assert all(c["enable_gqa"] == (attn.kv_heads != H) for c in calls)
    assert x.grad is not None and torch.isfinite(x.grad).all()
    # control: the spy does see the explicit path when weights are asked for
    attn(x, is_causal=True, need_weights=True)
    assert explicit == [1]


@pytest.mark.parametrize("variant", ["mha", "gqa", "alibi", "window", "all"])
def test_variants_reach_the_fused_cpu_kernel(variant):
    """Not SDPA's O(N²) math fallback either: e.g. a 3-D float mask (H, T, T) sends CPU SDPA there, a 4-D one does
    not. (Attention dropout > 0 takes the math kernel on CPU for every variant, plain MHA included: a torch limit.)"""
    from torch.profiler import ProfilerActivity, profile

    kw = dict(TRAIN_VARIANTS[variant])
    if "positions" in kw:
        kw["positions"] = make_positions(kw["positions"])
    attn = make(**kw).train()
    x = torch.randn(B, T, D, requires_grad=True)
    for kpm in (None, padding_mask([T, 5, 3], T)):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            attn(x, key_padding_mask=kpm, is_causal=True).sum().backward()
        kernels = {e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")}
        assert kernels == {"aten::_scaled_dot_product_flash_attention_for_cpu",
                           "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("kw,match", [
    ({"kv_heads": 3}, r"^model\.net\.n_heads=4 is not divisible by attn\.kv_heads=3 \(grouped-query"),
    ({"kv_heads": 0}, r"attn\.kv_heads=0"),
    ({"kv_heads": 8}, r"attn\.kv_heads=8"),
    ({"window": 0}, r"^attn\.window=0: must be a positive integer \(or null\)$"),
    ({"window": -2}, r"attn\.window=-2"),
    ({"window": 4, "kv_dim": 16}, r"attn\.window=4 applies to self-attention only"),
])
def test_refusals_are_one_line_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match) as err:
        MultiHeadAttention(D, H, **kw)
    assert isinstance(err.value, UserError) and "\n" not in str(err.value)


def test_positions_on_cross_attention_is_a_bug_not_a_config():
    with pytest.raises(ValueError, match="self-attention only"):
        MultiHeadAttention(D, H, kv_dim=16, positions=ALiBi(H))


def test_alibi_built_for_other_heads_is_a_bug():
    with pytest.raises(ValueError, match="ALiBi was built for 8 heads, this attention has n_heads=4"):
        MultiHeadAttention(D, H, positions=ALiBi(8))
