"""P4: greedy generation with the KV cache, tokens/s (new tokens × batch / s), 256 new tokens after a 16-token
prompt: the project's ``decoding.generate`` + ``CausalLMStepper`` vs HF GPT-2 ``generate`` (use_cache, greedy)
on the same shape (the P1 model, context 512), and vs the project's own generation without the cache.

Without the cache every step re-encodes the whole sequence: at batch 8 that is minutes on 2 cores, so the
no-cache side runs at batch 1 only (one alternated round after a short warm-up).
"""

from __future__ import annotations

import dataclasses

import torch

from attnlab.decoding import CausalLMStepper, generate

from .common import Table, alternate, hf_available, median, spread
from .models import ISSUE_SHAPE, hf_gpt2, ours

PROMPT = 16


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
                                                      "ratio cache/no-cache", "spread ours/HF"])
    for batch in (1, 8):
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(0, shape.vocab, (batch, PROMPT), generator=g)
        sides = {"ours": lambda: generate(CausalLMStepper(m, True), ids, new, temperature=0)}
        if h is not None:
            mask = torch.ones_like(ids)
            sides["hf"] = lambda: h.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                             use_cache=True)
        t = alternate(sides, repeats=repeats)
        tps = {k: batch * new / median(v) for k, v in t.items()}
        nocache, ratio_nc = "not run (minutes)", ""
        if batch == 1:
            t2 = alternate({"cache": sides["ours"],
                            "nocache": lambda: generate(CausalLMStepper(m, False), ids, new, temperature=0)},
                           repeats=1, warmup=0)
            nc = batch * new / median(t2["nocache"])
            nocache, ratio_nc = nc, f"{batch * new / median(t2['cache']) / nc:.1f}×"
        if h is not None:
            table.add(batch, tps["ours"], tps["hf"], f"{tps['ours'] / tps['hf']:.2f}×", "≥ 2×", nocache, ratio_nc,
                      f"{spread(t['ours'])}/{spread(t['hf'])}")
        else:
            table.add(batch, tps["ours"], "n/a", "n/a", "≥ 2×", nocache, ratio_nc, spread(t["ours"]))
    return [table]
