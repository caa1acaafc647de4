"""Decoder-only LM: shapes, tying, causality, KV-cache decoding, parameter counts, memorization."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.models.causal_lm import CausalLM
from attnlab.modules.attention import KVCache
from attnlab.modules.moe import MixtureOfExperts, moe_losses
from attnlab.builders import load_part

V = 50
POS_KINDS = ["learned", "rotary", "sinusoidal", "none"]
MOE_ON = load_part("moe", "on", num_experts=4, top_k=2)


def make_lm(pos="learned", moe=None, seed=0, **kw) -> CausalLM:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=V, d_model=32, n_layers=2, n_heads=4, max_len=24, dropout=0.0)
    cfg.update(kw)
    return CausalLM(**cfg, pos=load_part("pos", pos), moe=moe).eval()


def ids(b=2, t=10, seed=1):
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def test_logits_shape_and_tying():
    model = make_lm()
    assert model(ids(3, 7)).shape == (3, 7, V)
    assert model.head.weight is model.embed.weight
    untied = make_lm(tie_embeddings=False)
    assert untied.head.weight is not untied.embed.weight
    assert untied(ids(3, 7)).shape == (3, 7, V)


@pytest.mark.parametrize("pos", POS_KINDS)
def test_model_is_causal(pos):
    model = make_lm(pos)
    x = ids()
    t = 4
    x2 = x.clone()
    x2[:, t + 1 :] = (x[:, t + 1 :] + 1 + torch.arange(x.shape[1] - t - 1)) % V
    y1, y2 = model(x), model(x2)
    torch.testing.assert_close(y1[:, : t + 1], y2[:, : t + 1], atol=1e-5, rtol=0)
    assert not torch.allclose(y1[:, t + 1 :], y2[:, t + 1 :], atol=1e-4)


@pytest.mark.parametrize("pos", POS_KINDS)
def test_positions_matter(pos):
    """Swapping two earlier tokens changes the last position's logits only when the model has positions.

    With one layer and no positions, causal attention sees its prefix as a set, so the last output is unchanged.
    (With two layers it would change: the hidden states of earlier positions depend on their own prefixes.)
    """
    model = make_lm(pos, n_layers=1)
    with torch.no_grad():  # sharpen the attention (init std 0.02 leaves it almost uniform)
        for p in model.parameters():
            if p.dim() == 2 and p is not model.embed.weight:
                p.mul_(10)
    x = ids(1, 8)
    assert x[0, 1] != x[0, 4]
    x2 = x.clone()
    x2[0, [1, 4]] = x[0, [4, 1]]
    y, y2 = model(x)[0, -1], model(x2)[0, -1]
    if pos == "none":
        torch.testing.assert_close(y, y2, atol=1e-5, rtol=0)
    else:
        assert (y - y2).abs().max() > 1e-3


@pytest.mark.parametrize("moe", [None, MOE_ON], ids=["dense", "moe"])
@pytest.mark.parametrize("pos", POS_KINDS)
def test_kv_cache_decoding_equals_full_forward(pos, moe):
    model = make_lm(pos, moe)
    x = ids(2, 12)
    full = model(x)
    caches = model.new_caches(2)
    assert len(caches) == model.n_layers
    assert all(isinstance(c, KVCache) and c.max_len == model.max_len for c in caches)
    steps = [model(x[:, :5], caches)]
    for t in range(5, 12):
        steps.append(model(x[:, t : t + 1], caches))
    assert all(c.length == 12 for c in caches)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_new_caches_shape_and_max_len():
    model = make_lm(n_layers=3)
    caches = model.new_caches(5, max_len=9)
    assert len(caches) == 3
    assert caches[0].k.shape == (5, 4, 9, 8)
    assert caches[0].k.dtype == model.embed.weight.dtype
    assert caches[0] is not caches[1]


def test_exceeding_max_len_raises():
    model = make_lm(max_len=8)
    model(ids(1, 8))
    with pytest.raises(ValueError, match="max_len"):
        model(ids(1, 9))
    caches = model.new_caches(1)
    model(ids(1, 6), caches)
    model(ids(1, 2), caches)
    with pytest.raises(ValueError, match="max_len"):
        model(ids(1, 1), caches)


def test_num_params_counts():
    model = make_lm("learned")
    total = sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - V * 32 - 24 * 32  # minus the tied table and learned positions
    rot = make_lm("rotary")
    assert rot.num_params() == sum(p.numel() for p in rot.parameters()) - V * 32
    assert rot.num_params() == model.num_params()  # rotary and learned have the same blocks
    assert rot.active_params() == rot.num_params()  # dense: every parameter is active


@pytest.mark.parametrize("top_k", [1, 2])
def test_moe_params_and_active_params(top_k):
    n_experts = 4
    dense = make_lm("rotary")
    moe = make_lm("rotary", load_part("moe", "on", num_experts=n_experts, top_k=top_k))
    layers = [m for m in moe.modules() if isinstance(m, MixtureOfExperts)]
    assert len(layers) == moe.n_layers
    per_expert = sum(p.numel() for p in layers[0].experts[0].parameters())
    ffn_dense = sum(p.numel() for p in dense.decoder.layers[0].ffn.parameters())
    assert per_expert == ffn_dense
    router = 32 * n_experts
    L = moe.n_layers
    assert moe.num_params() == dense.num_params() + L * ((n_experts - 1) * per_expert + router)
    assert moe.active_params() == dense.num_params() + L * ((top_k - 1) * per_expert + router)
    assert moe.active_params() < moe.num_params()
    if top_k == 1:
        assert moe.active_params() == dense.num_params() + L * router
    assert moe.flops_per_token(16) > dense.flops_per_token(16)


def test_moe_losses_from_model():
    model = make_lm(moe=MOE_ON)
    assert moe_losses(make_lm()) == {}
    model(ids())
    losses = moe_losses(model)
    # near k = 2 (the balanced value) for a router at initialization, far below the collapsed E = 4
    assert 2.0 - 0.05 < losses["moe/load_balance"].item() < 2.5
    assert losses["moe/loss"].requires_grad


def test_dropout_active_only_in_training():
    model = make_lm(dropout=0.5)
    x = ids()
    torch.testing.assert_close(model(x), model(x))
    model.train()
    torch.manual_seed(0)
    a = model(x)
    b = model(x)
    assert not torch.allclose(a, b)


def test_overfits_one_batch(one_thread):
    torch.manual_seed(0)
    model = CausalLM(V, d_model=64, n_layers=2, n_heads=4, max_len=32, dropout=0.0)
    batch = torch.randint(0, V, (4, 32), generator=torch.Generator().manual_seed(0))
    inp, tgt = batch[:, :-1], batch[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    first = None
    for _ in range(150):
        loss = F.cross_entropy(model(inp).reshape(-1, V), tgt.reshape(-1))
        first = loss.item() if first is None else first
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        final = F.cross_entropy(model(inp).reshape(-1, V), tgt.reshape(-1)).item()
    assert first == pytest.approx(torch.log(torch.tensor(float(V))).item(), abs=0.3)  # starts near uniform
    assert final < 0.5
