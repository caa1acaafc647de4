"""P1: one LM training step (forward + backward + AdamW), tokens/s, ours vs two independent implementations of the
same LM: HF transformers GPT-2 (sdpa) and a stack of ``torch.nn.TransformerEncoderLayer`` (pre-norm, causal mask;
``bench.models.TorchLayersLM``), all three with the same parameter count.

Each side takes its own idiomatic path: ours the project's training loss (``tasks.causal_lm.lm_loss``, the fused
head + cross-entropy) and the AdamW every task builds (``optim.build_optimizer``: fused); GPT-2 its own ``labels=``
loss and ``torch.optim.AdamW(fused=True)`` (what HF's Trainer uses by default with recent torch); the torch-layers
LM logits + ``F.cross_entropy`` and the same fused AdamW. The same token batch goes to all. MFU = tokens/s ×
training FLOPs per token (6·N + 6·d·V + 12·L·d·T, ``CausalLM.flops_per_token``, the same count for both models
since they have the same shape) / a matmul peak measured here in the same dtype.

A third side, "before", is the project's model as it trained before this issue (the unfused head +
``F.cross_entropy`` + the old per-tensor for-loop AdamW), alternated in the same loop.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from attnlab.optim import build_optimizer
from attnlab.tasks.causal_lm import lm_loss

from .common import Table, alternate, fast_bf16, hf_available, matmul_peak, median, spread
from .models import ISSUE_SHAPE, hf_gpt2, ours, token_batch, torch_layers_lm

OPT_CFG = {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8}
# ours: the same AdamW as a config names it (conf/optim/adamw.yaml), built the way every task builds its optimizer
OURS_OPTIMIZER = {"_target_": "torch.optim.AdamW", **OPT_CFG}


def _autocast(bf16: bool):
    return torch.autocast("cpu", torch.bfloat16) if bf16 else contextlib.nullcontext()


def ours_step(model, opt, ids, labels, bf16: bool, fused_loss: bool = True):
    def step():
        with _autocast(bf16):
            loss = (lm_loss(model, ids, labels) if fused_loss
                    else F.cross_entropy(model(ids).flatten(0, 1), labels.flatten()))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def hf_step(model, opt, ids, bf16: bool):
    def step():
        with _autocast(bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def torch_step(model, opt, ids, labels, bf16: bool):
    def step():
        with _autocast(bf16):
            loss = model.loss(ids, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def configs(quick: bool) -> list[tuple[str, int]]:
    """(precision, batch). bf16 is emulated without AMX/AVX512-BF16 (~40x slower than fp32): batch 1 there."""
    if quick:
        return [("fp32", 2), ("bf16", 1)] if fast_bf16() else [("fp32", 2)]
    return [("fp32", 16), ("bf16", 16 if fast_bf16() else 1)]


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    shape = ISSUE_SHAPE
    repeats = repeats or (2 if quick else 3)
    seq = 64 if quick else shape.seq_len
    main = Table(
        f"P1 LM train step (fwd+bwd+AdamW), tokens/s: L={shape.n_layers} H={shape.n_heads} d={shape.d_model} "
        f"T={seq} V={shape.vocab}, no dropout",
        ["precision", "batch", "ours tok/s", "HF GPT-2 tok/s", "ratio ours/HF", "target",
         "torch layers tok/s", "ratio ours/torch layers", "ours MFU", "HF MFU", "torch layers MFU",
         "matmul peak GFLOP/s", "ours before tok/s", "ratio ours/before", "spread ours/HF/torch/before"])
    main.notes.append("before = the project's model as it trained before issue 5 (logits + F.cross_entropy, "
                      "torch.optim.AdamW's default for-loop on CPU); ours = fused head + CE "
                      "(modules/loss.py) and fused AdamW (optim.build_optimizer); torch layers = "
                      "nn.TransformerEncoderLayer(norm_first=True) × L with a causal mask, logits + F.cross_entropy, "
                      "fused AdamW (bench/models.TorchLayersLM). All sides alternate in one loop.")
    for precision, batch in configs(quick):
        bf16 = precision == "bf16"
        peak = matmul_peak(torch.bfloat16 if bf16 else torch.float32)
        ids, labels = token_batch(batch, seq, shape.vocab)
        m = ours(shape)
        fpt = m.flops_per_token(seq)
        sides = {"ours": ours_step(m, build_optimizer(m, OURS_OPTIMIZER), ids, labels, bf16)}
        if hf_available():
            h = hf_gpt2(shape)
            sides["hf"] = hf_step(h, torch.optim.AdamW(h.parameters(), fused=True, **OPT_CFG), ids, bf16)
        tl = torch_layers_lm(shape)
        sides["torch"] = torch_step(tl, torch.optim.AdamW(tl.parameters(), fused=True, **OPT_CFG), ids, labels, bf16)
        if not bf16 or fast_bf16():  # emulated bf16: a fourth side would add minutes for the same code change
            before = ours(shape)
            legacy = torch.optim.AdamW(before.parameters(), foreach=False, **OPT_CFG)  # the old CPU default
            sides["before"] = ours_step(before, legacy, ids, labels, bf16, fused_loss=False)
        t = alternate(sides, repeats=repeats)
        tok = {k: batch * seq / median(v) for k, v in t.items()}
        mfu = {k: v * fpt / peak for k, v in tok.items()}
        na = "n/a (pip install -e '.[bench]')"
        main.add(precision, batch, tok["ours"], tok.get("hf", "n/a"),
                 f"{tok['ours'] / tok['hf']:.2f}×" if "hf" in tok else na, "≥1.6×" if bf16 else "≥1.15×",
                 tok["torch"], f"{tok['ours'] / tok['torch']:.2f}×",
                 f"{100 * mfu['ours']:.1f}%", f"{100 * mfu['hf']:.1f}%" if "hf" in mfu else "n/a",
                 f"{100 * mfu['torch']:.1f}%", peak / 1e9,
                 tok.get("before", "not run"),
                 f"{tok['ours'] / tok['before']:.2f}×" if "before" in tok else "",
                 "/".join(spread(t[k]) for k in sides))
        del sides, m
    if not fast_bf16():
        main.notes.append("This CPU has no AMX/AVX512-BF16: bf16 matmuls are emulated (~40x slower than fp32), "
                          "so bf16 runs at batch 1 and fp32 is the meaningful CPU comparison.")
    if quick:
        main.notes.append(f"--quick: T={seq} and small batches; run without --quick for the issue's shape.")
    return [main]
