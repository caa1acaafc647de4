"""Every part a config group gives is built once per layer and per expert: no module of a net is shared between two
places, so a learnable part (``ffn.activation._target_=torch.nn.PReLU``) has its own parameters in each."""

from __future__ import annotations

import pytest
import torch
from helpers import compose_train

from attnlab.modules.feedforward import FeedForward
from attnlab.core.paths import CONF_DIR
from attnlab.tasks.base import build_net

TINY = ["model=causal_lm", "model.net.d_model=16", "model.net.n_layers=3", "model.net.n_heads=2",
        "data.vocab_size=300", "data.seq_len=8"]
MOE = ["moe.num_experts=2", "moe.top_k=2"]  # every token through both experts: each gets a gradient


def tiny_lm(tmp_path, *overrides: str) -> torch.nn.Module:
    """The net `python train.py model=causal_lm <overrides>` builds, through the task's own builder."""
    moe = MOE if "moe=on" in overrides else []
    return build_net(compose_train([*TINY, *moe, *overrides], tmp_path).model.net)


def shared_modules(net: torch.nn.Module) -> list[str]:
    """The names under which a module already seen appears again."""
    seen, again = set(), []
    for name, module in net.named_modules(remove_duplicate=False):
        if id(module) in seen:
            again.append(name)
        seen.add(id(module))
    return again


@pytest.mark.parametrize("moe", sorted(p.stem for p in (CONF_DIR / "moe").glob("*.yaml")))
@pytest.mark.parametrize("ffn", sorted(p.stem for p in (CONF_DIR / "ffn").glob("*.yaml")))
def test_no_module_is_shared_between_layers_or_experts(ffn, moe, tmp_path):
    net = tiny_lm(tmp_path, f"ffn={ffn}", f"moe={moe}")
    assert shared_modules(net) == []
    assert len([m for m in net.modules() if isinstance(m, FeedForward)]) == 3 * (2 if moe == "on" else 1)


@pytest.mark.parametrize("moe", ["off", "on"])
def test_a_learnable_activation_is_each_layers_and_each_experts_own(moe, tmp_path):
    net = tiny_lm(tmp_path, "ffn.activation._target_=torch.nn.PReLU", f"moe={moe}")
    acts = [m.activation for m in net.modules() if isinstance(m, FeedForward)]
    assert len(acts) == 3 * (2 if moe == "on" else 1) and all(isinstance(a, torch.nn.PReLU) for a in acts)
    weights = [a.weight for a in acts]
    assert len({w.data_ptr() for w in weights}) == len(weights)
    params = list(net.parameters())
    assert all(sum(p is w for p in params) == 1 for w in weights)  # each one a parameter the optimizer sees

    # a gradient step on the first layer's (first expert's) activation moves that one and no other
    before = [w.detach().clone() for w in weights]
    opt = torch.optim.SGD([weights[0]], lr=1.0)
    logits = net(torch.randint(0, 300, (2, 8)))
    logits = logits[0] if isinstance(logits, tuple) else logits
    logits.float().square().mean().backward()
    assert all(w.grad is not None for w in weights)
    opt.step()
    assert not torch.equal(weights[0], before[0])
    assert all(torch.equal(w, b) for w, b in zip(weights[1:], before[1:]))
