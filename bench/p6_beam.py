"""P6: beam search (beam 5, 50 new tokens, no EOS so every step runs) with the KV cache vs recomputing the whole
decoder each step, through the same ``decoding.beam_search`` and each model's stepper (``use_cache=True/False``):

* the translation model (``models.transformer_mt``, issue 3): encoder run once, decoder cached (self-attention
  keys/values growing, cross-attention keys/values of the source computed once);
* the causal LM (the P1 model) with ``CausalLMStepper``.

The "weight-matmul floor" is P4's (``p4_generate.matmul_floor``, the faster of the two weight layouts) for one search:
``new tokens`` steps of the products of ``sentences × beam`` rows with every weight matrix a decoding step reads (the
translation decoder's self-attention, cross-attention query and output, feed-forward and output layer; not the
encoder nor the cross-attention keys/values, computed once per sentence). "cache / floor" is what issue 15 targets
(≥ 0.85): the rest of a step is attention, norms, the beam's top-k and the cache reorder.
"""

from __future__ import annotations

import torch

from attnlab.decoding import CausalLMStepper, DecodingOptions, beam_search

from .common import Table, alternate, median, spread
from .models import ISSUE_SHAPE, ours
from .p4_generate import floor_seconds, floor_sides, linear_weights

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


def step_weights(model) -> list[torch.Tensor]:
    """The weights one cached decoding step multiplies by: an LM's all; a translation model's decoder (less the
    cross-attention keys/values of the source, computed once) and output layer."""
    if hasattr(model, "encoder"):
        kv = {layer.cross_attn.kv_proj.weight.data_ptr() for layer in model.decoder.layers}
        return [w for w in linear_weights([model.decoder, model.head]) if w.data_ptr() not in kv]
    return linear_weights(model)


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    repeats = repeats or 2  # the recompute side takes ~10-30 s per search here
    length = 12 if quick else 50
    table = Table(f"P6 beam search, beam {BEAM}, {length} new tokens, fp32: KV cache vs recompute each step",
                  ["model", "sentences", "with KV cache ms", "recompute ms", "ratio recompute/cache", "target",
                   "weight-matmul floor ms", "cache / floor", "target", "spread cache/recompute/floors",
                   "same best hypothesis"])
    lm, mt = ours(ISSUE_SHAPE).eval(), _mt()
    cases = []
    options = DecodingOptions(beam_size=BEAM, max_new_tokens=length, early_stopping=True)
    for batch in (1, 4):
        g = torch.Generator().manual_seed(batch)
        if mt is not None:
            src = torch.randint(2, ISSUE_SHAPE.vocab, (batch, SRC), generator=g)
            mask = torch.ones_like(src, dtype=torch.bool)
            bos = torch.full((batch, 1), BOS)
            cases.append((f"transformer_mt (src {SRC} tokens)", batch, mt,
                          lambda c, s=src, m=mask, b=bos: beam_search(mt.stepper(s, m, c), b, options)))
        ids = torch.randint(0, ISSUE_SHAPE.vocab, (batch, PROMPT), generator=g)
        cases.append((f"causal LM (prompt {PROMPT} tokens)", batch, lm,
                      lambda c, i=ids: beam_search(CausalLMStepper(lm, c), i, options)))
    floors = []
    for name, batch, model, search in cases:
        sides = {"cache": lambda: search(True), "recompute": lambda: search(False)}
        sides.update(floor_sides(step_weights(model), batch * BEAM, length))
        t = alternate(sides, repeats=repeats)
        same = all(torch.equal(a, b) for a, b in zip(search(True).best, search(False).best))
        c, r = median(t["cache"]), median(t["recompute"])
        floor, note = floor_seconds(t)
        floors.append(f"{name.split(' ')[0]} ×{batch}: {note}")
        table.add(name, batch, 1000 * c, 1000 * r, f"{r / c:.2f}×", "≥ 3×", 1000 * floor, f"{floor / c:.2f}",
                  "≥ 0.85", "/".join(spread(v) for v in t.values()), "yes" if same else "no (float ties)")
    table.notes.append("Floor: the faster of the two weight layouts (" + "; ".join(floors) + ").")
    if mt is None:
        table.notes.append("attnlab.models.transformer_mt is not installed here: causal LM rows only.")
    return [table]
