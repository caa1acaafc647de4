"""``python -m bench [--quick] [--only P1,P3] [--markdown FILE] [--json FILE]``: every comparison of issue 5,
printed as tables.

Run from the repository root with the package installed (``pip install -e '.[bench]'`` adds HF transformers).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch

from .common import CLOCKS, choose_threads, machine_info, set_clock

COMPARISONS = {
    "P1": "p1_train_step",
    "P2": "p2_lightning",
    "P3": "p3_attention",
    "P4": "p4_generate",
    "P5": "p5_moe",
    "P6": "p6_beam",
    "P7": "p7_monitor",
    "P8": "p8_gqa",
    "P9": "p9_norms",
    "P10": "p10_attention_callback",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small shapes and few repeats (smoke test, ~1 min)")
    ap.add_argument("--only", default="", help="comma-separated subset, e.g. P1,P3")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds per comparison (default 3, quick 2)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads; default: all cores on an idle machine, 1 when the load average "
                         "is above half the cores (two threads on a busy 2-core machine ran matmuls 30x slower)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: elapsed time (default); cpu: this process's CPU time, for a machine shared with other "
                         "jobs (the time the bench actually ran; one thread). P2/P7 time Lightning runs by wall clock "
                         "either way, and the matmul peak behind MFU is always wall time")
    ap.add_argument("--markdown", default=None, help="also write the tables to this file")
    ap.add_argument("--json", default=None,
                    help="also write the machine facts and every table (raw numbers) to this JSON file")
    args = ap.parse_args(argv)
    chosen = [c.strip().upper() for c in args.only.split(",") if c.strip()] or list(COMPARISONS)
    unknown = [c for c in chosen if c not in COMPARISONS]
    if unknown:
        ap.error(f"unknown comparison(s) {unknown}; choose from {', '.join(COMPARISONS)}")

    if args.clock == "cpu" and args.threads not in (None, 1):
        ap.error("--clock cpu adds up the CPU time of every thread: use it with --threads 1")
    set_clock(args.clock)
    threads, why = (1, "--clock cpu") if args.clock == "cpu" else choose_threads(args.threads)
    torch.set_num_threads(threads)
    machine = machine_info()
    command = f"python -m bench {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip()
    out = ["## Machine", ""] + [f"- {k}: {v}" for k, v in machine.items()]
    out.append(f"- threads chosen: {threads} ({why})")
    out.append(f"- clock: {args.clock}")
    out.append(f"- command: {command}")
    print("\n".join(out), flush=True)
    record = {"machine": machine, "threads": threads, "threads_why": why, "clock": args.clock, "command": command,
              "quick": args.quick,
              "comparisons": {}}
    for name in chosen:
        mod = importlib.import_module(f".{COMPARISONS[name]}", __package__)
        t0 = time.perf_counter()
        tables = mod.run(quick=args.quick, repeats=args.repeats)
        for table in tables:
            text = table.markdown()
            print("\n" + text, flush=True)
            out += ["", text]
        seconds = time.perf_counter() - t0
        print(f"\n({name} took {seconds:.0f} s)", flush=True)
        record["comparisons"][name] = {"seconds": round(seconds, 1), "tables": [t.to_dict() for t in tables]}
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(out) + "\n")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")  # a crash never leaves half a file for a reader
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
