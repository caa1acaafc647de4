"""AdamW of every task: fused where allowed (a 3-5x faster optimizer step on CPU), the same groups as before."""

import torch

from attnlab.models.causal_lm import CausalLM
from attnlab.optim import build_optimizer

CFG = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1,
       "eps": 1e-8}


def _net():
    return CausalLM(vocab_size=30, d_model=16, n_layers=1, n_heads=2, max_len=8, dropout=0.0)


def test_fused_on_cpu_and_groups():
    opt = build_optimizer(_net(), CFG, "32-true")
    assert opt.defaults["fused"] is True
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() < 2 for p in no_decay["params"])


def test_not_fused_under_mixed_precision():
    # Lightning's mixed-precision plugin refuses gradient clipping with an optimizer that says it unscales its
    # gradients itself, as a fused AdamW does (tests/test_train.py's bf16-mixed run clips at 1.0)
    assert not build_optimizer(_net(), CFG, "16-mixed").defaults["fused"]
    assert not build_optimizer(_net(), CFG, "bf16-mixed").defaults["fused"]
    assert build_optimizer(_net(), CFG, "bf16-true").defaults["fused"]


def test_fused_steps_like_the_for_loop_adamw():
    torch.manual_seed(0)
    a, b = _net(), _net()
    b.load_state_dict(a.state_dict())
    oa = build_optimizer(a, CFG)
    ob = build_optimizer(b, {**CFG, "fused": False, "foreach": False})
    for _ in range(3):
        for net, opt in ((a, oa), (b, ob)):
            net(torch.arange(8)[None] % 30).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5)
