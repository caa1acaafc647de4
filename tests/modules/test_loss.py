"""The fused linear cross-entropy equals logits + F.cross_entropy (value and gradients), without the logits."""

import pytest
import torch
import torch.nn.functional as F

from attnlab.models.causal_lm import CausalLM
from attnlab.modules.loss import linear_cross_entropy
from attnlab.tasks.causal_lm import lm_loss


def _data(n=150, d=16, v=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, requires_grad=True)
    w = torch.randn(v, d, generator=g, requires_grad=True)
    y = torch.randint(0, v, (n,), generator=g)
    return h, w, y


@pytest.mark.parametrize("chunk", [1, 32, 1024])
def test_matches_unfused_loss_and_grads(chunk):
    h, w, y = _data()
    y[::5] = -100  # ignored positions get no loss and no gradient
    ref = F.cross_entropy(h @ w.t(), y)
    g_ref = torch.autograd.grad(ref * 3.0, (h, w))
    got = linear_cross_entropy(h, w, y, chunk=chunk)
    g_got = torch.autograd.grad(got * 3.0, (h, w))  # the incoming gradient scales the saved ones
    torch.testing.assert_close(got, ref)
    for a, b in zip(g_got, g_ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_no_grad_and_3d_inputs():
    h, w, y = _data(n=24)
    with torch.no_grad():
        got = linear_cross_entropy(h.view(2, 12, -1), w, y.view(2, 12))
    torch.testing.assert_close(got, F.cross_entropy(h @ w.t(), y).detach())


def test_bf16_autocast_close_to_fp32():
    h, w, y = _data()
    with torch.autocast("cpu", torch.bfloat16):
        got = linear_cross_entropy(h, w, y)
        gh, gw = torch.autograd.grad(got, (h, w))
    assert got.dtype == torch.float32 and gh.dtype == h.dtype and gw.dtype == w.dtype
    torch.testing.assert_close(got, F.cross_entropy(h @ w.t(), y), atol=0.05, rtol=0.02)


def test_lm_loss_of_causal_lm_matches_logits_path():
    torch.manual_seed(0)
    net = CausalLM(vocab_size=40, d_model=32, n_layers=2, n_heads=2, max_len=16, dropout=0.0)
    ids, labels = torch.randint(0, 40, (3, 16)), torch.randint(0, 40, (3, 16))
    ref = F.cross_entropy(net(ids).flatten(0, 1), labels.flatten())
    g_ref = torch.autograd.grad(ref, list(net.parameters()))
    got = lm_loss(net, ids, labels)
    g_got = torch.autograd.grad(got, list(net.parameters()))
    torch.testing.assert_close(got, ref)
    for a, b in zip(g_got, g_ref):  # the tied embedding/head gets both contributions
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_last_only_logits():
    torch.manual_seed(0)
    net = CausalLM(vocab_size=40, d_model=32, n_layers=2, n_heads=2, max_len=16, dropout=0.0).eval()
    ids = torch.randint(0, 40, (2, 9))
    torch.testing.assert_close(net(ids, last_only=True), net(ids)[:, -1:])
