"""P8: grouped-query attention at generation time: KV-cache bytes and greedy tokens/s with the KV cache for
multi-head (kv_heads = n_heads), grouped-query (kv_heads = 2) and multi-query (kv_heads = 1) attention, at P4's
shape (the P1 model, context 512, 256 new tokens after a 16-token prompt), batch 1 and 8.

The cache is ``model.new_caches(batch, prompt + new)``: its bytes shrink by n_heads / kv_heads exactly. What that
buys in tokens/s depends on how much of a decode step's memory traffic is the cache: every step reads all the
weights once (P4's floor) plus the cache's filled part, so the gain grows with batch and context. The models are
untrained and identical except for the K/V projections (GQA has fewer parameters there; the column says how many).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from attnlab.decoding import CausalLMStepper, SamplingOptions, generate
from attnlab.models.causal_lm import CausalLM
from attnlab.modules.attention import MultiHeadAttention

from .common import Table, alternate, median, spread
from .models import ISSUE_SHAPE, Shape

PROMPT = 16
# --quick: a small model and few tokens (a smoke test of the table, seconds); the full run is P4's shape
QUICK_SHAPE = Shape(vocab=512, d_model=96, n_layers=2, n_heads=6, seq_len=64, max_len=64)


def lm(shape: Shape, kv_heads: int, seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(shape.vocab, shape.d_model, shape.n_layers, shape.n_heads, max_len=shape.max_len,
                    dropout=0.0, attn_dropout=0.0,
                    attn=functools.partial(MultiHeadAttention, kv_heads=kv_heads)).eval()


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    repeats = repeats or (2 if quick else 3)
    new = 16 if quick else 256
    shape = QUICK_SHAPE if quick else dataclasses.replace(ISSUE_SHAPE, max_len=512)
    h = shape.n_heads
    variants = {"mha": h, "gqa": 2, "mqa": 1}
    models = {name: lm(shape, kv) for name, kv in variants.items()}
    positions = PROMPT + new
    table = Table(f"P8 KV cache of mha / gqa / mqa: greedy generation, {new} new tokens after {PROMPT}, "
                  f"L={shape.n_layers} d={shape.d_model} H={h} V={shape.vocab}, fp32",
                  ["batch", "attention", "kv_heads", "parameters", "KV-cache MB", "cache ratio mha/this",
                   "tokens/s (KV cache)", "ratio this/mha", "spread"])
    for batch in (1, 8):
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(0, shape.vocab, (batch, PROMPT), generator=g)
        cache_bytes = {name: sum(c.nbytes for c in m.new_caches(batch, positions)) for name, m in models.items()}
        # a fresh stepper per call: CausalLMStepper keeps its state, so bind the model, not one stepper
        greedy = SamplingOptions(max_new_tokens=new, temperature=0)
        sides = {name: (lambda m=m: generate(CausalLMStepper(m, True), ids, greedy))
                 for name, m in models.items()}
        t = alternate(sides, repeats=repeats)
        tps = {name: batch * new / median(v) for name, v in t.items()}
        for name, kv in variants.items():
            table.add(batch, name, kv, f"{sum(p.numel() for p in models[name].parameters()):,}",
                      cache_bytes[name] / 2**20, f"{cache_bytes['mha'] / cache_bytes[name]:.1f}×", tps[name],
                      f"{tps[name] / tps['mha']:.2f}×", spread(t[name]))
    table.notes.append(f"KV-cache MB: all layers' keys and values for {positions} positions (prompt + new) at that "
                       f"batch, fp32; the cache ratio is n_heads / kv_heads by construction.")
    table.meta.update({"shape": dataclasses.asdict(shape), "new_tokens": new, "prompt": PROMPT})
    return [table]
