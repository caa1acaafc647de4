"""P6: beam search (beam 5, 50 new tokens, no EOS so every step runs) with the KV cache vs recomputing the whole
decoder each step, through the same ``decoding.beam_search`` and ``CausalLMStepper(use_cache=True/False)``.

The decoder is the causal LM (the P1 model): the translation model of issue 3 was not on main when this bench
was written; its stepper plugs into the same ``beam_search``.
"""

from __future__ import annotations

import torch

from attnlab.decoding import CausalLMStepper, beam_search

from .common import Table, alternate, median, spread
from .models import ISSUE_SHAPE, ours

PROMPT, BEAM = 16, 5


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    repeats = repeats or (2 if quick else 3)
    length = 12 if quick else 50
    m = ours(ISSUE_SHAPE).eval()
    table = Table(f"P6 beam search, beam {BEAM}, {length} new tokens after {PROMPT}, the P1 causal LM, fp32",
                  ["sentences", "with KV cache ms", "recompute ms", "ratio recompute/cache", "target", "spread",
                   "same best hypothesis"])
    for batch in (1, 4):
        ids = torch.randint(0, ISSUE_SHAPE.vocab, (batch, PROMPT), generator=torch.Generator().manual_seed(batch))
        run_ = lambda cache: beam_search(CausalLMStepper(m, cache), ids, beam_size=BEAM,  # noqa: E731
                                         max_new_tokens=length)
        t = alternate({"cache": lambda: run_(True), "recompute": lambda: run_(False)}, repeats=repeats)
        same = all(torch.equal(a, b) for a, b in zip(run_(True).best, run_(False).best))
        c, r = median(t["cache"]), median(t["recompute"])
        table.add(batch, 1000 * c, 1000 * r, f"{r / c:.2f}×", "≥ 3×", f"{spread(t['cache'])}/{spread(t['recompute'])}",
                  "yes" if same else "no (float ties)")
    return [table]
