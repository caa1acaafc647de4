"""P6: beam search (beam 5, 50 new tokens, no EOS so every step runs) with the KV cache vs recomputing the whole
decoder each step, through the same ``decoding.beam_search`` and each model's stepper (``use_cache=True/False``):

* the translation model (``models.transformer_mt``, issue 3): encoder run once, decoder cached (self-attention
  keys/values growing, cross-attention keys/values of the source computed once);
* the causal LM (the P1 model) with ``CausalLMStepper``.
"""

from __future__ import annotations

import torch

from attnlab.decoding import CausalLMStepper, beam_search

from .common import Table, alternate, median, spread
from .models import ISSUE_SHAPE, ours

PROMPT, SRC, BEAM, BOS = 16, 20, 5, 1


def _mt():
    """The MT model at the P1 width (d=384, 6 heads, 6 encoder + 6 decoder layers, V=8192), or None."""
    try:
        from attnlab.models.transformer_mt import TransformerMT
    except ImportError:
        return None
    torch.manual_seed(0)
    return TransformerMT(ISSUE_SHAPE.vocab, d_model=ISSUE_SHAPE.d_model, n_layers=ISSUE_SHAPE.n_layers,
                         n_heads=ISSUE_SHAPE.n_heads, max_len=128, dropout=0.0).eval()


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    repeats = repeats or 2  # the recompute side takes ~10-30 s per search here
    length = 12 if quick else 50
    table = Table(f"P6 beam search, beam {BEAM}, {length} new tokens, fp32: KV cache vs recompute each step",
                  ["model", "sentences", "with KV cache ms", "recompute ms", "ratio recompute/cache", "target",
                   "spread", "same best hypothesis"])
    lm, mt = ours(ISSUE_SHAPE).eval(), _mt()
    cases = []
    for batch in (1, 4):
        g = torch.Generator().manual_seed(batch)
        if mt is not None:
            src = torch.randint(2, ISSUE_SHAPE.vocab, (batch, SRC), generator=g)
            mask = torch.ones_like(src, dtype=torch.bool)
            bos = torch.full((batch, 1), BOS)
            cases.append((f"transformer_mt (src {SRC} tokens)", batch,
                          lambda c, s=src, m=mask, b=bos: beam_search(mt.stepper(s, m, c), b, beam_size=BEAM,
                                                                      max_new_tokens=length)))
        ids = torch.randint(0, ISSUE_SHAPE.vocab, (batch, PROMPT), generator=g)
        cases.append((f"causal LM (prompt {PROMPT} tokens)", batch,
                      lambda c, i=ids: beam_search(CausalLMStepper(lm, c), i, beam_size=BEAM,
                                                   max_new_tokens=length)))
    for name, batch, search in cases:
        t = alternate({"cache": lambda: search(True), "recompute": lambda: search(False)}, repeats=repeats)
        same = all(torch.equal(a, b) for a, b in zip(search(True).best, search(False).best))
        c, r = median(t["cache"]), median(t["recompute"])
        table.add(name, batch, 1000 * c, 1000 * r, f"{r / c:.2f}×", "≥ 3×",
                  f"{spread(t['cache'])}/{spread(t['recompute'])}", "yes" if same else "no (float ties)")
    if mt is None:
        table.notes.append("attnlab.models.transformer_mt is not installed here: causal LM rows only.")
    return [table]
