"""P9: LayerNorm vs RMSNorm, the layers of ``norm=pre`` and ``norm=rms`` (conf/norm/), forward + backward.

RMSNorm skips LayerNorm's mean and its subtraction (and the bias): fewer operations per element, which is the seed's
"cheaper" (C14, claim E9). Whether a step gets faster depends on the kernels. In PyTorch's eager mode on CPU,
``torch.nn.LayerNorm`` runs one fused native kernel while ``torch.nn.RMSNorm`` is a composite of several elementwise
and reduction kernels (each a pass over memory), so the eager numbers compare two implementations more than two
algorithms. ``torch.compile`` fuses both into generated kernels by the same compiler: that pair compares the
algorithms. The compiled rows are left out with ``--quick`` (compiling takes seconds per shape). The project's own
``norm=rms`` layer (``attnlab.modules.norm.RMSNorm``: torch's, with a shorter CPU path) is timed in eager mode
beside both; compiled, it is torch's.

Tokens × d as in a training step of E9's GPT (32 × 128 tokens, d_model 128) and at a wider d; fp32; the backward
gets a fixed upstream gradient. ``meta`` holds every round's time for the claim's interval.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.modules.norm import RMSNorm

from .common import Table, alternate, median, spread

EPS = 1e-5  # conf/norm/pre.yaml and rms.yaml


def layers(d: int, mode: str) -> dict[str, nn.Module]:
    built = {"LayerNorm": nn.LayerNorm(d, eps=EPS), "RMSNorm": nn.RMSNorm(d, eps=EPS)}
    if mode == "compiled":  # under torch.compile the project's layer runs torch's forward: nothing else to time
        return {name: torch.compile(layer) for name, layer in built.items()}
    return {**built, "RMSNorm (attnlab)": RMSNorm(d, eps=EPS)}


def forward_backward(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor):
    def call():
        layer(x).backward(grad)
        x.grad = None
    return call


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    repeats = repeats or (2 if quick else 15)
    shapes = [(512, 32)] if quick else [(32 * 128, 128), (32 * 128, 1024)]  # (tokens, d)
    modes = ["eager"] if quick else ["eager", "compiled"]
    table = Table("P9 LayerNorm vs RMSNorm, forward + backward, fp32",
                  ["tokens × d", "kernels", "LayerNorm ms", "RMSNorm ms", "RMSNorm / LayerNorm",
                   "attnlab RMSNorm ms", "attnlab / LayerNorm", "spread (LN, RMS, attnlab)"])
    rounds: dict[str, dict[str, list[float]]] = {}
    for tokens, d in shapes:
        torch.manual_seed(0)
        x = torch.randn(tokens, d, requires_grad=True)
        grad = torch.randn(tokens, d)
        for mode in modes:
            built = layers(d, mode)
            # the first call of a compiled layer compiles it: alternate's warm-up takes that out of the timing
            t = alternate({name: forward_backward(layer, x, grad) for name, layer in built.items()}, repeats=repeats)
            ln, rms = median(t["LayerNorm"]), median(t["RMSNorm"])
            ours = median(t["RMSNorm (attnlab)"]) if "RMSNorm (attnlab)" in t else None
            table.add(f"{tokens} × {d}", "torch eager" if mode == "eager" else "torch.compile", 1000 * ln,
                      1000 * rms, f"{rms / ln:.2f}×", "" if ours is None else 1000 * ours,
                      "" if ours is None else f"{ours / ln:.2f}×", ", ".join(spread(ts) for ts in t.values()))
            rounds[f"{tokens}x{d}/{mode}"] = {name: [1000 * s for s in ts] for name, ts in t.items()}
    table.meta["rounds_ms"] = rounds
    table.notes.append("Below 1× RMSNorm is cheaper. Eager: torch.nn.LayerNorm is one fused kernel, torch.nn.RMSNorm "
                       "about ten, the project's RMSNorm (norm=rms) five forward + backward; compiled: LayerNorm and "
                       "torch's RMSNorm, both fused by inductor.")
    return [table]
