"""P4: greedy generation with the KV cache, tokens/s (new tokens × batch / s), 256 new tokens after a 16-token
prompt: the project's ``decoding.generate`` + ``CausalLMStepper`` vs HF GPT-2 ``generate`` (use_cache, greedy)
on the same shape (the P1 model, context 512), and vs the project's own generation without the cache.

Without the cache every step re-encodes the whole sequence: at batch 8 that is minutes on 2 cores, so the
no-cache side runs at batch 1 only (one alternated round after a short warm-up).

The "weight-matmul floor" column is what no fp32 decoder of this model can beat: per new token, only the matrix
products with every weight matrix of the model (the blocks' projections and the output layer), timed alone, at the
same batch, on the same inputs and thread count, in the faster of two weight layouts: (out, in) as ``nn.Linear``
stores it (``F.linear``) and a contiguous (in, out) copy (``x @ w_t``, faster for few rows on some CPUs; our decoders
keep nn.Linear's layout: decoding from cached (in, out) copies was tried in issue 15 and dropped, 0-4 % of a greedy
generation for a second copy of every weight); both are timed in the same alternated loop and the table notes each. At batch 1 these are
matrix-vector products that read every weight once per token. "floor/HF" is then the largest ratio over HF that any
implementation could reach here. The target is now the floor itself (issue 15: ours/floor ≥ 0.85). The floor leaves
out attention over the cache (at batch 8 and 272 positions its keys and values are ~40 % of the bytes read per
token): a generous bound, tightest at batch 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.decoding import CausalLMStepper, SamplingOptions, generate

from .common import Table, alternate, hf_available, median, spread
from .models import ISSUE_SHAPE, hf_gpt2, ours

PROMPT = 16


def linear_weights(modules) -> list[torch.Tensor]:
    """Every distinct ``nn.Linear`` weight under ``modules`` (a module or a list of them; a tied one once)."""
    modules = modules if isinstance(modules, (list, tuple)) else [modules]
    found = {}
    for top in modules:
        for m in top.modules():
            if isinstance(m, nn.Linear):
                found.setdefault(id(m.weight), m.weight.detach())
    return list(found.values())


def matmul_floor(model, batch: int, steps: int, layout: str = "stored") -> Callable[[], None]:
    """``steps`` decode steps of only the weight matmuls: a (batch, in) input times every ``nn.Linear`` weight of
    ``model`` (a module, a list of modules, or a list of weights; a tied output layer counts once, as it is read
    once). ``layout`` "stored": ``F.linear`` with the (out, in) weight as ``nn.Linear`` keeps it; "transposed":
    ``x @ w_t`` with a contiguous (in, out) copy."""
    weights = (model if isinstance(model, list) and all(isinstance(w, torch.Tensor) for w in model)
               else linear_weights(model))
    if layout not in ("stored", "transposed"):
        raise ValueError(f"layout must be 'stored' or 'transposed', got {layout!r}")
    if layout == "transposed":
        weights = [w.t().contiguous() for w in weights]
    inputs = [torch.randn(batch, w.shape[1] if layout == "stored" else w.shape[0]) for w in weights]
    product = F.linear if layout == "stored" else torch.mm

    def step() -> None:
        with torch.inference_mode():
            for _ in range(steps):
                for x, w in zip(inputs, weights):
                    product(x, w)

    return step


def floor_sides(model, batch: int, steps: int) -> dict[str, Callable[[], None]]:
    """The two floor layouts as sides of :func:`alternate` (the floor is the faster one: :func:`floor_seconds`)."""
    return {"floor (out,in)": matmul_floor(model, batch, steps, "stored"),
            "floor (in,out)": matmul_floor(model, batch, steps, "transposed")}


def floor_seconds(times: dict[str, list[float]]) -> tuple[float, str]:
    """(median seconds of the faster floor layout, a note with both)."""
    med = {k: median(v) for k, v in times.items() if k.startswith("floor")}
    best = min(med, key=med.get)
    return med[best], ", ".join(f"{k[6:]} {1000 * v:,.0f} ms" for k, v in med.items())


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    repeats = repeats or (2 if quick else 3)
    new = 32 if quick else 256
    shape = dataclasses.replace(ISSUE_SHAPE, max_len=512)
    m = ours(shape).eval()
    h = None
    if hf_available():
        h = hf_gpt2(shape).eval()
        h.generation_config.eos_token_id = None  # run to max_new_tokens, like ours
        h.generation_config.pad_token_id = 0
    table = Table(f"P4 greedy generation, {new} new tokens after {PROMPT}, L={shape.n_layers} d={shape.d_model} "
                  f"V={shape.vocab}, fp32: tokens/s", ["batch", "ours (KV cache)", "HF GPT-2 generate (cache)",
                                                      "ratio ours/HF", "ours without cache",
                                                      "ratio cache/no-cache", "weight-matmul floor",
                                                      "best possible ours/HF (floor/HF)", "ours / floor", "target",
                                                      "spread ours/HF/floors"])
    floors = []
    greedy = SamplingOptions(max_new_tokens=new, temperature=0)
    for batch in (1, 8):
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(0, shape.vocab, (batch, PROMPT), generator=g)
        sides = {"ours": lambda: generate(CausalLMStepper(m, True), ids, greedy)}
        if h is not None:
            mask = torch.ones_like(ids)
            sides["hf"] = lambda: h.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                             use_cache=True)
        sides.update(floor_sides(m, batch, new))
        t = alternate(sides, repeats=repeats)
        tps = {k: batch * new / median(v) for k, v in t.items()}
        floor_s, note = floor_seconds(t)
        floors.append(f"batch {batch}: {note}")
        tps["floor"] = batch * new / floor_s
        nocache, ratio_nc = "not run (minutes)", ""
        if batch == 1:
            t2 = alternate({"cache": sides["ours"],
                            "nocache": lambda: generate(CausalLMStepper(m, False), ids, greedy)},
                           repeats=1, warmup=0)
            nc = batch * new / median(t2["nocache"])
            nocache, ratio_nc = nc, f"{batch * new / median(t2['cache']) / nc:.1f}×"
        floor = [tps["floor"], f"{tps['floor'] / tps['hf']:.2f}×" if h is not None else "n/a",
                 f"{tps['ours'] / tps['floor']:.2f}", "≥ 0.85"]
        spreads = "/".join(spread(v) for v in t.values())
        if h is not None:
            table.add(batch, tps["ours"], tps["hf"], f"{tps['ours'] / tps['hf']:.2f}×", nocache, ratio_nc,
                      *floor, spreads)
        else:
            table.add(batch, tps["ours"], "n/a", "n/a", nocache, ratio_nc, *floor, spreads)
    table.notes.append("Floor: the faster of the two weight layouts, per generation (" + "; ".join(floors) + ").")
    return [table]
