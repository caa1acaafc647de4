"""P5: a mixture-of-experts feed-forward (E=8, top-2, the project's sort/group dispatch) vs a dense feed-forward
of one expert's size on the same tokens, and vs a naive per-expert masking loop (the textbook dispatch, written
here as the baseline: for each expert, a boolean mask picks its tokens; weights gathered per mask).

Forward + backward, fp32, d=384, GELU experts with hidden 4d. The ideal MoE/dense ratio is 2 (each token runs
through 2 experts); what is above 2 is routing, dispatch and combine.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.modules.feedforward import FeedForward
from attnlab.modules.moe import MixtureOfExperts

from .common import Table, alternate, median, spread

D, E, K = 384, 8, 2


def naive_moe(moe: MixtureOfExperts, x: Tensor) -> Tensor:
    """The same routing as ``moe``, dispatched with one boolean mask per expert (no sort, no grouping)."""
    flat = x.reshape(-1, x.shape[-1])
    _, ids, weights = moe.route(flat)
    y = torch.zeros_like(flat)
    for e, expert in enumerate(moe.experts):
        hit = ids == e  # (N, k)
        rows = hit.any(dim=-1)
        if rows.any():
            w = (weights * hit).sum(dim=-1)[rows, None]
            y[rows] += w * expert(flat[rows])
    return y.reshape(x.shape)


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    repeats = repeats or (2 if quick else 5)
    tokens = 1024 if quick else 4096
    torch.manual_seed(0)
    dense = FeedForward(D)  # GELU, hidden 4d
    moe = MixtureOfExperts(D, [FeedForward(D) for _ in range(E)], top_k=K)
    x = torch.randn(tokens, D, requires_grad=True)

    def fb(fn):
        def call():
            fn(x).sum().backward()
            x.grad = None
        return call

    t = alternate({"dense": fb(dense), "moe": fb(moe), "naive": fb(lambda h: naive_moe(moe, h))},
                  repeats=repeats)
    d, m, n = (median(t[k]) for k in ("dense", "moe", "naive"))
    table = Table(f"P5 MoE E={E} top-{K} vs dense (one expert's size), {tokens} tokens, d={D}, fwd+bwd fp32",
                  ["variant", "ms", "ratio to dense", "target", "spread"])
    table.add("dense FFN (4d GELU)", 1000 * d, "1.00×", "", spread(t["dense"]))
    table.add("MoE, sort/group dispatch (modules/moe.py)", 1000 * m, f"{m / d:.2f}×", "≤ 2.4× (2× ideal)",
              spread(t["moe"]))
    table.add("MoE, naive per-expert masking loop", 1000 * n, f"{n / d:.2f}×", "", spread(t["naive"]))
    table.add("ratio naive / sort-group", "", f"{n / m:.2f}×", "", "")
    return [table]
