"""``python -m bench [--quick] [--only P1,P3] [--markdown FILE]``: every comparison of issue 5, printed as tables.

Run from the repository root with the package installed (``pip install -e '.[bench]'`` adds HF transformers).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

import torch

from .common import choose_threads, machine_info

COMPARISONS = {
    "P1": "p1_train_step",
    "P2": "p2_lightning",
    "P3": "p3_attention",
    "P4": "p4_generate",
    "P5": "p5_moe",
    "P6": "p6_beam",
    "P7": "p7_monitor",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small shapes and few repeats (smoke test, ~1 min)")
    ap.add_argument("--only", default="", help="comma-separated subset, e.g. P1,P3")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds per comparison (default 3, quick 2)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads; default: all cores on an idle machine, 1 when the load average "
                         "is above half the cores (two threads on a busy 2-core machine ran matmuls 30x slower)")
    ap.add_argument("--markdown", default=None, help="also write the tables to this file")
    args = ap.parse_args(argv)
    chosen = [c.strip().upper() for c in args.only.split(",") if c.strip()] or list(COMPARISONS)
    unknown = [c for c in chosen if c not in COMPARISONS]
    if unknown:
        ap.error(f"unknown comparison(s) {unknown}; choose from {', '.join(COMPARISONS)}")

    threads, why = choose_threads(args.threads)
    torch.set_num_threads(threads)
    out = ["## Machine", ""] + [f"- {k}: {v}" for k, v in machine_info().items()]
    out.append(f"- threads chosen: {threads} ({why})")
    out.append(f"- command: python -m bench {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print("\n".join(out), flush=True)
    for name in chosen:
        mod = importlib.import_module(f".{COMPARISONS[name]}", __package__)
        t0 = time.perf_counter()
        tables = mod.run(quick=args.quick, repeats=args.repeats)
        for table in tables:
            text = table.markdown()
            print("\n" + text, flush=True)
            out += ["", text]
        print(f"\n({name} took {time.perf_counter() - t0:.0f} s)", flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
