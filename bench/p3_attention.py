"""P3: attention forward time and peak memory vs sequence length, SDPA fast path vs the explicit path.

One ``MultiHeadAttention`` (d=384, 6 heads, causal, batch 1), forward only (inference / the attention-map pass;
the explicit path only runs when weights are asked for). Time: alternated, median. Peak memory: the largest
resident memory the call adds (the kernel's high-water RSS, reset just before, minus the RSS then; CPU has no
``max_memory_allocated``), so the input and the module's weights are not counted. Linux only.
"""

from __future__ import annotations

import ctypes

import torch
from torch.profiler import ProfilerActivity, profile

from attnlab.modules.attention import MultiHeadAttention

from .common import Table, alternate, median

D, H = 384, 6


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_bytes(fn) -> int:
    """Peak resident memory that ``fn()`` adds: freed heap is first returned to the OS (``malloc_trim``), the
    kernel's high-water mark is reset to the current RSS (``/proc/self/clear_refs`` 5), then VmHWM − VmRSS.
    Real process memory, allocator included; -1 where Linux's /proc or glibc is missing."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status_kib("VmRSS")
    except (OSError, KeyError):
        return -1
    out = fn()
    del out
    return (_status_kib("VmHWM") - base) * 1024


def attention_ops(fn) -> list[str]:
    """The attention-related aten ops one ``fn()`` runs (profiler): names which kernel "fast" is on this machine,
    e.g. ``aten::_scaled_dot_product_flash_attention_for_cpu`` (SDPA's fused, flash-style CPU kernel)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    keys = {e.key for e in prof.key_averages()}
    return sorted(k for k in keys if any(w in k for w in ("attention", "softmax", "bmm", "matmul")))


def available_bytes() -> int | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run(quick: bool = False, repeats: int | None = None) -> list[Table]:
    repeats = repeats or (2 if quick else 3)
    lengths = [256, 512, 1024] if quick else [256, 512, 1024, 2048, 4096, 8192]
    attn = MultiHeadAttention(D, H).eval()
    table = Table(f"P3 attention forward (d={D}, {H} heads, causal, batch 1, fp32): fast (SDPA) vs explicit",
                  ["T", "fast ms", "explicit ms", "ratio explicit/fast (time)", "fast peak MiB",
                   "explicit peak MiB", "ratio explicit/fast (memory)", "fast mem growth ×/2T",
                   "explicit mem growth ×/2T"])
    prev = None
    last_explicit = None
    with torch.inference_mode():
        for T in lengths:
            x = torch.randn(1, T, D)
            sides = {"fast": lambda: attn(x, is_causal=True),
                     "explicit": lambda: attn(x, is_causal=True, need_weights=True)}
            if prev is None:
                table.meta["ops"] = {k: attention_ops(fn) for k, fn in sides.items()}
            long = T >= 4096  # one explicit call takes ~10-50 s here: one round, no warm-up (done at shorter T)
            t = alternate(sides, repeats=1 if long else repeats, warmup=0 if long else 1)
            mem = {k: peak_bytes(fn) for k, fn in sides.items()}
            growth = ({k: f"{mem[k] / prev[k]:.2f}" for k in mem} if prev else {"fast": "-", "explicit": "-"})
            table.add(T, 1000 * median(t["fast"]), 1000 * median(t["explicit"]),
                      f"{median(t['explicit']) / median(t['fast']):.2f}×", mem["fast"] / 2**20,
                      mem["explicit"] / 2**20, f"{mem['explicit'] / mem['fast']:.1f}×",
                      growth["fast"], growth["explicit"])
            growth_last = growth
            prev, last_explicit = mem, (T, mem["explicit"])
            attn.weights = None
    table.meta.update(d_model=D, heads=H, batch=1, dtype="float32", causal=True, lengths=lengths,
                      device="cpu", threads=torch.get_num_threads())
    table.notes.append("Ops (profiler) — fast: " + ", ".join(table.meta["ops"]["fast"]) + "; explicit: "
                       + ", ".join(table.meta["ops"]["explicit"]) + ".")
    avail = available_bytes()
    if avail and last_explicit:
        T, b = last_explicit
        # explicit memory is dominated by the (H, T, T) scores/weights: quadratic, so T_max = T·sqrt(avail/b)
        t_max = int(T * (avail / b) ** 0.5)
        table.notes.append(
            f"Explicit path: every length above fitted; at the last doubling its memory grew "
            f"{growth_last['explicit']}× (quadratic: 4), the fast path's {growth_last['fast']}× (linear: 2). With "
            f"{avail / 2**30:.1f} GiB available now it would stop fitting near T≈{t_max:,} (batch 1; ÷√B for "
            f"batch B), projected from the T={T} peak. T ≥ 4096: one timed round without warm-up.")
    return [table]
