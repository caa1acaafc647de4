"""GPU check for a lent accelerator (H200): bf16 LM throughput and MFU at a larger shape, flash SDPA, compile on
and off. ``bench/gpu_check.sh`` runs this, then a 1-GPU Lightning run of each model family. ``--smoke`` runs the
same code on CPU at toy sizes (to catch errors on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from attnlab.callbacks.throughput import measure_matmul_peak
from attnlab.models.causal_lm import CausalLM
from attnlab.optim import build_optimizer
from attnlab.tasks.causal_lm import lm_loss

ADAMW = {"_target_": "torch.optim.AdamW", "lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8}


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, warmup=3, repeats=10) -> float:
    for _ in range(warmup):
        fn()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(dev)
    return (time.perf_counter() - t0) / repeats


def lm_rows(dev, smoke: bool) -> None:
    # GPT-2 small-ish: 12 layers, d=768, T=1024, V=32768, batch 16 (bf16 autocast)
    L_, d, h, T, V, B = (2, 64, 2, 64, 512, 2) if smoke else (12, 768, 12, 1024, 32768, 16)
    peak = measure_matmul_peak(torch.bfloat16, dev)
    print(f"bf16 matmul peak measured: {peak / 1e12:.1f} TFLOP/s")
    print("| compile | tokens/s | MFU | step ms |\n|---|---|---|---|")
    for compile_ in (False, True):
        torch.manual_seed(0)
        net = CausalLM(V, d, L_, h, max_len=T, dropout=0.0).to(dev)
        # the AdamW a bf16-mixed training run builds (not fused under mixed precision: optim.build_optimizer)
        opt = build_optimizer(net, ADAMW, "bf16-mixed")
        fwd = torch.compile(net) if compile_ else net
        ids = torch.randint(0, V, (B, T), device=dev)

        def step():
            with torch.autocast(dev.type, torch.bfloat16):
                # compiled: logits + CE inside the graph; eager: the fused head + CE
                loss = (F.cross_entropy(fwd(ids).flatten(0, 1).float(), ids.flatten()) if compile_
                        else lm_loss(net, ids, ids))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        dt = timed(step, dev, warmup=3 if compile_ else 2, repeats=2 if smoke else 10)
        tps = B * T / dt
        print(f"| {compile_} | {tps:,.0f} | {100 * tps * net.flops_per_token(T) / peak:.1f}% | {1000 * dt:.1f} |")


def sdpa_rows(dev, smoke: bool) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, Dh = (1, 2, 32) if smoke else (4, 16, 64)
    lengths = [128, 256] if smoke else [1024, 4096, 16384]
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH}
    if dev.type != "cuda":
        backends.pop("efficient")
    print("| T | backend | fwd+bwd ms | peak MiB |\n|---|---|---|---|")
    for T in lengths:
        q, k, v = (torch.randn(B, H, T, Dh, device=dev, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        for name, backend in backends.items():
            def fb():
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            try:
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                ms = 1000 * timed(fb, dev, warmup=1, repeats=3)
                mem = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else float("nan")
                print(f"| {T} | {name} | {ms:.2f} | {mem:,.0f} |")
            except (RuntimeError, torch.OutOfMemoryError) as e:  # e.g. flash not built for this GPU, math OOM
                print(f"| {T} | {name} | failed: {str(e).splitlines()[0][:60]} | |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU, toy sizes")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("\n### bf16 LM train step (fwd+bwd+AdamW as bf16-mixed training builds it), 12L d=768 T=1024 V=32768 "
          "batch 16")
    lm_rows(dev, args.smoke)
    print("\n### SDPA backends, causal, bf16, fwd+bwd")
    sdpa_rows(dev, args.smoke)


if __name__ == "__main__":
    main()
