"""Measurements on a causal LM that its logged metrics do not hold (used by claims E3, E5; any trained or freshly
built ``CausalLMTask`` works).

All take the net (or task) and a fixed batch of windows, e.g. the first windows of the validation split
(:func:`val_batch`): the mean next-token loss with or without the causal mask, the attention weights' entropy and
peak, the gradient norm of the attention projections, and a greedy continuation of a validation prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def val_batch(dm, n: int) -> dict[str, Tensor]:
    """The first ``n`` validation windows of a set-up LM data module, stacked:
    {'input_ids': (n, T), 'labels': (n, T)}."""
    ds = dm.val_dataset
    items = [ds[i] for i in range(min(n, len(ds)))]
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


@torch.no_grad()
def lm_loss(net, batch: dict[str, Tensor], causal: bool | None = None) -> float:
    """Mean next-token cross-entropy (nats); ``causal`` overrides the net's own mask setting for this call."""
    from ..tasks.causal_lm import lm_loss as loss_fn

    was = net.causal
    net.causal = was if causal is None else causal
    try:
        return float(loss_fn(net, batch["input_ids"], batch["labels"]))
    finally:
        net.causal = was


@dataclass
class AttentionStats:
    entropy: float  # mean over layers, heads and queries, nats
    max_entropy: float  # the same mean of log(number of keys a query may see): uniform attention
    peak: float  # mean over queries of the largest attention weight
    saturated: float  # fraction of query rows whose largest weight exceeds 0.9

    @property
    def relative(self) -> float:
        return self.entropy / self.max_entropy


@torch.no_grad()
def attention_stats(net, ids: Tensor) -> AttentionStats:
    """Entropy and peak of every self-attention row of ``net`` on ``ids`` (query 0 of a causal row, which sees one
    key, is left out: its entropy is 0 whatever the scores)."""
    from ..modules.attention import capture_attention

    with capture_attention(net) as maps:
        net(ids)
    ent, max_ent, peak, sat = [], [], [], []
    for w in maps.values():  # (B, H, Tq, Tk)
        w = w.float()
        tq, tk = w.shape[-2:]
        visible = (torch.arange(1, tq + 1) if net.causal else torch.full((tq,), tk)).expand(w.shape[:-1])
        rows = visible > 1
        h = -(w * w.clamp_min(1e-30).log()).sum(-1)
        ent.append(h[rows])
        max_ent.append(visible[rows].float().log())
        top = w.max(-1).values[rows]
        peak.append(top)
        sat.append((top > 0.9).float())
    cat = lambda xs: float(torch.cat(xs).mean())  # noqa: E731
    return AttentionStats(cat(ent), cat(max_ent), cat(peak), cat(sat))


def attention_grad_norm(task, batch: dict[str, Tensor]) -> float:
    """L2 norm of the loss gradient w.r.t. the query and key projections' weights, over all layers: the gradient
    that reaches them only through the softmax, so it shrinks as the softmax saturates. Dropout off."""
    from ..tasks.causal_lm import lm_loss as loss_fn

    net = task.net.eval()
    net.zero_grad(set_to_none=True)
    with torch.enable_grad():
        loss_fn(net, batch["input_ids"], batch["labels"]).backward()
    grads = [p.grad[: 2 * p.grad.shape[1]] for n, p in net.named_parameters()  # rows: [W_q; W_k; W_v]
             if n.endswith("self_attn.qkv_proj.weight") and p.grad is not None]
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
    net.zero_grad(set_to_none=True)
    return norm


@torch.no_grad()
def greedy(task, dm, prompt_tokens: int = 16, new_tokens: int = 32) -> tuple[str, str]:
    """(prompt, greedy continuation) from the start of the validation split, KV-cache decoding (always causal)."""
    prefix = dm.example_text(prompt_tokens)
    out = task.sample(prefix, {"max_new_tokens": new_tokens, "temperature": 0.0}, vocab_size=dm.vocab_size)
    return dm.decode(prefix[0].tolist()), dm.decode(out[0, prompt_tokens:].tolist())
