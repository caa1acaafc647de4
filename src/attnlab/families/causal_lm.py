"""The decoder-only language model (GPT): ``model=causal_lm``, served by ``generate.py``."""

from __future__ import annotations

from . import BLOCK_GROUPS, Family


def batch_loss(net, gen):
    import torch
    import torch.nn.functional as F

    ids = torch.randint(4, net.vocab_size, (4, 12), generator=gen)
    return F.cross_entropy(net(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())


FAMILY = Family(
    name="causal_lm",
    task="attnlab.tasks.causal_lm.CausalLMTask",
    net="attnlab.models.causal_lm.CausalLM",
    data="lm_text",
    groups=BLOCK_GROUPS,
    what="a language model",
    serves="generate.py",
    description="decoder-only transformer language model (GPT) on text (CPython's docs by default)",
    batch_loss=batch_loss,
    explorer_input="text",
)
