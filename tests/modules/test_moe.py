"""Mixture of experts: routing, dispatch vs a naive loop, auxiliary losses, gradients."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.modules.feedforward import FeedForward


def build_ffn(activation: str, dim: int, hidden_mult: float = 4.0) -> FeedForward:
    return FeedForward(dim, nn.ReLU if activation == "relu" else nn.GELU, hidden_mult=hidden_mult)
from attnlab.modules.moe import MixtureOfExperts, expert_fractions, moe_layers, moe_losses

D, E = 16, 4


def make_moe(top_k: int = 2, n_experts: int = E, seed: int = 0, **kw) -> MixtureOfExperts:
    torch.manual_seed(seed)
    experts = [build_ffn("gelu", D, hidden_mult=2.0) for _ in range(n_experts)]
    moe = MixtureOfExperts(D, experts, top_k=top_k, **kw)
    nn.init.normal_(moe.router.weight, std=1.0)  # spread the routing so that several experts are used
    return moe


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_route_picks_k_distinct_experts_with_normalized_weights(top_k):
    moe = make_moe(top_k)
    x = torch.randn(40, D)
    logits, ids, w = moe.route(x)
    assert logits.shape == (40, E) and logits.dtype == torch.float32
    assert ids.shape == (40, top_k) and w.shape == (40, top_k)
    assert ((0 <= ids) & (ids < E)).all()
    for row in ids.tolist():
        assert len(set(row)) == top_k
    if top_k > 1:  # Mixtral: renormalized over the chosen experts
        torch.testing.assert_close(w.sum(-1), torch.ones(40), atol=1e-6, rtol=0)
    else:  # Switch: the raw router probability, so the router gets gradient from the task loss
        torch.testing.assert_close(w[:, 0], logits.softmax(-1).max(-1).values)
    assert (w > 0).all()
    # the chosen experts are the top-k by router probability, weights proportional to those probabilities
    probs = logits.softmax(-1)
    top = probs.topk(top_k, -1)
    assert torch.equal(ids, top.indices)
    if top_k > 1:
        torch.testing.assert_close(w, top.values / top.values.sum(-1, keepdim=True))


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_dispatch_equals_naive_loop(top_k):
    moe = make_moe(top_k)
    x = torch.randn(3, 7, D)
    y = moe(x)
    assert y.shape == x.shape
    flat = x.reshape(-1, D)
    _, ids, w = moe.route(flat)
    ref = torch.zeros_like(flat)
    for n in range(flat.shape[0]):
        for j in range(top_k):
            ref[n] += w[n, j] * moe.experts[int(ids[n, j])](flat[n : n + 1])[0]
    torch.testing.assert_close(y.reshape(-1, D), ref, atol=1e-5, rtol=0)


def test_dispatch_uses_several_experts():
    moe = make_moe(2)
    moe(torch.randn(64, D))
    assert (moe.expert_fraction > 0).sum() >= 3


def test_expert_fraction_matches_route_counts():
    moe = make_moe(2)
    x = torch.randn(5, 6, D)
    moe(x)
    _, ids, _ = moe.route(x.reshape(-1, D))
    counts = torch.bincount(ids.reshape(-1), minlength=E).float()
    assert moe.expert_fraction.shape == (E,)
    assert not moe.expert_fraction.requires_grad
    torch.testing.assert_close(moe.expert_fraction.sum(), torch.tensor(1.0))
    torch.testing.assert_close(moe.expert_fraction, counts / counts.sum())


def mixtral_load_balancing_loss(router_logits: torch.Tensor, num_experts: int, top_k: int) -> torch.Tensor:
    """HF Mixtral's ``load_balancing_loss_func`` (modeling_mixtral.py) for one layer without padding, written out
    from its definition: softmax, top-k, one-hot assignments (N, k, E) averaged over tokens, times the mean router
    probability of each expert, summed over slots and experts, times E."""
    routing_weights = router_logits.softmax(dim=-1)
    selected = routing_weights.topk(top_k, dim=-1).indices
    expert_mask = nn.functional.one_hot(selected, num_experts).float()  # (N, k, E)
    tokens_per_expert = expert_mask.mean(dim=0)  # (k, E)
    router_prob_per_expert = routing_weights.mean(dim=0)  # (E,)
    return (tokens_per_expert * router_prob_per_expert[None]).sum() * num_experts


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_load_balance_loss_equals_mixtral_reference(top_k):
    for seed in range(3):
        moe = make_moe(top_k, seed=seed)
        x = torch.randn(37, D)
        moe(x)
        ref = mixtral_load_balancing_loss(moe.router(x).float(), E, top_k)
        torch.testing.assert_close(moe.aux_loss, ref, rtol=1e-6, atol=0)
        # the Switch Transformer form at k = 1: E · Σ_e (fraction of tokens to e) · (mean probability of e)
        if top_k == 1:
            counts = torch.bincount(moe.router(x).argmax(-1), minlength=E).float()
            p = moe.router(x).softmax(-1).mean(0)
            torch.testing.assert_close(moe.aux_loss, E * (counts / 37 * p).sum(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_load_balance_loss_is_k_for_uniform_router(top_k):
    moe = make_moe(top_k)
    nn.init.zeros_(moe.router.weight)
    moe(torch.randn(32, D))
    assert moe.aux_loss.item() == pytest.approx(top_k, abs=1e-6)
    assert moe.z_loss.item() == pytest.approx(math.log(E) ** 2, abs=1e-5)
    assert moe.loss().item() == pytest.approx(0.01 * top_k + 0.001 * math.log(E) ** 2, abs=1e-6)


def test_load_balance_loss_of_a_collapsed_router_approaches_e():
    moe = make_moe(1)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[2] = 0.5  # expert 2 gets a large logit for inputs with positive feature sum
    x = torch.randn(32, D).abs()
    moe(x)
    assert moe.expert_fraction[2].item() == 1.0
    p2 = moe.router(x).softmax(-1)[:, 2].mean().item()
    assert moe.aux_loss.item() == pytest.approx(E * p2, rel=1e-6)  # f = (0, 0, 1, 0): E · P_2
    assert 1.5 < moe.aux_loss.item() <= E


@pytest.mark.slow  # importing transformers takes seconds; the formula above is the default test
def test_load_balance_loss_equals_hf_mixtral():
    mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")
    for top_k in (1, 2, 3):
        moe = make_moe(top_k, seed=top_k)
        x = torch.randn(29, D)
        moe(x)
        ref = mixtral.load_balancing_loss_func((moe.router(x).float(),), E, top_k)
        torch.testing.assert_close(moe.aux_loss, ref, rtol=1e-6, atol=0)


def test_z_loss_grows_with_router_scale():
    moe = make_moe(2)
    x = torch.randn(16, D)
    moe(x)
    small = moe.z_loss.item()
    with torch.no_grad():
        moe.router.weight.mul_(10)
    moe(x)
    assert moe.z_loss.item() > small


def test_gradients_reach_router_and_experts():
    moe = make_moe(2)
    x = torch.randn(24, D)
    moe(x).pow(2).sum().backward()
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
    used = moe.expert_fraction > 0
    for e, expert in enumerate(moe.experts):
        g = expert.up_proj.weight.grad
        if used[e]:
            assert g is not None and g.abs().sum() > 0
        else:
            assert g is None or g.abs().sum() == 0

    moe.zero_grad(set_to_none=True)
    moe(x)
    (moe.aux_loss + moe.z_loss).backward()
    assert moe.router.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in moe.experts.parameters())


def test_top1_router_gets_gradient_from_task_loss():
    moe = make_moe(1)
    moe(torch.randn(24, D)).pow(2).sum().backward()
    assert moe.router.weight.grad.abs().max() > 1e-4


@pytest.mark.parametrize("top_k", [0, E + 1])
def test_top_k_out_of_range_raises(top_k):
    with pytest.raises(ValueError, match="top_k"):
        MixtureOfExperts(D, [build_ffn("relu", D) for _ in range(E)], top_k=top_k)


def test_moe_losses_helpers():
    dense = nn.Sequential(build_ffn("relu", D), build_ffn("relu", D))
    assert moe_losses(dense) == {}
    assert expert_fractions(dense) is None
    assert moe_layers(dense) == []

    model = nn.Sequential(make_moe(2, seed=1), make_moe(1, seed=2))
    assert moe_losses(model) == {}  # no forward yet
    model(torch.randn(10, D))
    losses = moe_losses(model)
    assert set(losses) == {"moe/loss", "moe/load_balance", "moe/z_loss"}
    a, b = model[0], model[1]
    torch.testing.assert_close(losses["moe/loss"], a.loss() + b.loss())
    torch.testing.assert_close(losses["moe/load_balance"], (a.aux_loss + b.aux_loss) / 2)
    assert expert_fractions(model).shape == (2, E)


def test_pooled_balance_loss_equals_mixtral_over_all_layers():
    """`moe.balance=pooled` is HF Mixtral's one term over every layer's router logits concatenated (layers that route
    different numbers of tokens, as an encoder and a decoder do, weigh by their tokens); `layer` sums per layer."""
    pooled = [make_moe(2, seed=s, balance="pooled") for s in (1, 2, 3)]
    xs = [torch.randn(n, D) for n in (10, 10, 23)]
    for m, x in zip(pooled, xs):
        m(x)
    model = nn.ModuleList(pooled)
    logits = torch.cat([m.router(x).float() for m, x in zip(pooled, xs)])
    balance = mixtral_load_balancing_loss(logits, E, 2)
    z = sum(0.001 * m.z_loss for m in pooled)
    torch.testing.assert_close(moe_losses(model)["moe/loss"], 0.01 * balance + z, rtol=1e-6, atol=0)
    assert moe_losses(model)["moe/loss"] < sum(m.loss() for m in pooled)  # ~1/3 of the push of 3 layers' terms
    moe_losses(model)["moe/loss"].backward()  # the pooled P_e keeps the router's gradient
    assert all(m.router.weight.grad.abs().sum() > 0 for m in pooled)
    pooled[0].aux_loss_coef = 0.02
    with pytest.raises(ValueError, match="same balance, aux_loss_coef"):
        moe_losses(model)
    with pytest.raises(ValueError, match=r"^moe\.balance=sum: choose one of layer, pooled$"):
        MixtureOfExperts(D, [build_ffn("relu", D) for _ in range(E)], balance="sum")
