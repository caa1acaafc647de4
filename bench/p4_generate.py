"""P4: greedy generation with the KV cache, tokens/s (new tokens × batch / s), 256 new tokens after a 16-token
prompt: the project's ``decoding.generate`` + ``CausalLMStepper`` vs HF GPT-2 ``generate`` (use_cache, greedy)
on the same shape (the P1 model, context 512), and vs the project's own generation without the cache.

Without the cache every step re-encodes the whole sequence: at batch 8 that is minutes on 2 cores, so the
no-cache side runs at batch 1 only (one alternated round after a short warm-up).

The "weight-matmul floor" column is what no fp32 decoder of this model can beat: per new token, only the matrix
products with every weight matrix of the model (the blocks' projections and the output layer), timed alone, at the
same batch, on the same inputs and thread count. At batch 1 these are matrix-vector products that read every weight
once per token, so they are bound by memory bandwidth, not arithmetic. "floor/HF" is then the largest ratio over HF
that any implementation could reach here: if it is below the target, the target needs fewer bytes per weight
(bf16/int8 weights) or more tokens per weight read (speculative decoding), not less overhead. (The floor leaves
out attention over the cache, ~10 % of the bytes read per token at the end of this run: a generous bound.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.decoding import CausalLMStepper, generate

from .common import Table, alternate, hf_available, median, spread
from .models import ISSUE_SHAPE, hf_gpt2, ours

PROMPT = 16


def matmul_floor(model: nn.Module, batch: int, steps: int) -> Callable[[], None]:
    """``steps`` decode steps of only the weight matmuls: ``F.linear`` of a (batch, in) input with every
    ``nn.Linear`` weight of ``model`` (a tied output layer counts once, as it is read once)."""
    weights = list({id(m.weight): m.weight.detach() for m in model.modules() if isinstance(m, nn.Linear)}.values())
    inputs = [torch.randn(batch, w.shape[1]) for w in weights]

    def step() -> None:
        with torch.inference_mode():
            for _ in range(steps):
                for x, w in zip(inputs, weights):
                    F.linear(x, w)

    return step


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
                                                      "ratio ours/HF", "target", "ours without cache",
                                                      "ratio cache/no-cache", "weight-matmul floor",
                                                      "best possible ours/HF (floor/HF)", "ours / floor",
                                                      "spread ours/HF"])
    for batch in (1, 8):
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(0, shape.vocab, (batch, PROMPT), generator=g)
        sides = {"ours": lambda: generate(CausalLMStepper(m, True), ids, new, temperature=0)}
        if h is not None:
            mask = torch.ones_like(ids)
            sides["hf"] = lambda: h.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                             use_cache=True)
        sides["floor"] = matmul_floor(m, batch, new)
        t = alternate(sides, repeats=repeats)
        tps = {k: batch * new / median(v) for k, v in t.items()}
        nocache, ratio_nc = "not run (minutes)", ""
        if batch == 1:
            t2 = alternate({"cache": sides["ours"],
                            "nocache": lambda: generate(CausalLMStepper(m, False), ids, new, temperature=0)},
                           repeats=1, warmup=0)
            nc = batch * new / median(t2["nocache"])
            nocache, ratio_nc = nc, f"{batch * new / median(t2['cache']) / nc:.1f}×"
        floor = [tps["floor"], f"{tps['floor'] / tps['hf']:.2f}×" if h is not None else "n/a",
                 f"{tps['ours'] / tps['floor']:.2f}"]
        if h is not None:
            table.add(batch, tps["ours"], tps["hf"], f"{tps['ours'] / tps['hf']:.2f}×", "≥ 2×", nocache, ratio_nc,
                      *floor, f"{spread(t['ours'])}/{spread(t['hf'])}")
        else:
            table.add(batch, tps["ours"], "n/a", "n/a", "≥ 2×", nocache, ratio_nc, *floor, spread(t["ours"]))
    return [table]
