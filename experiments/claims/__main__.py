"""``python -m experiments.claims list | run <id …|all> [--quick] | report``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import all_claims, get_claim
from .report import CLI, write_report
from .runner import REPO, ClaimRunError, run_claim, with_seeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=CLI, description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="every claim, its command(s) and expected minutes")
    run = sub.add_parser("run", help="run claims and save their results and figures under docs/")
    run.add_argument("ids", nargs="+", help="E1 … E18, or all")
    run.add_argument("--quick", action="store_true", help="tiny runs, results next to the runs (a smoke test)")
    run.add_argument("--analyze-only", action="store_true", help="reuse the runs already in --out")
    run.add_argument("--out", type=Path, default=REPO / "outputs" / "claims", help="where the runs go")
    run.add_argument("--docs", type=Path, default=REPO / "docs", help="where results/ figures/ results.md go")
    rep = sub.add_parser("report", help="write docs/results.md from docs/results/*.json")
    rep.add_argument("--docs", type=Path, default=REPO / "docs")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            for c in all_claims().values():
                seeds = f", {c.seeds} seeds per setting" if c.seeds > 1 else ""
                print(f"{c.id:>4}  {c.title}  (~{c.minutes:.0f} min{seeds})")
                for command in [with_seeds(x, c.seeds) for x in c.commands] or [f"(no training of its own: analyzes the runs of {', '.join(c.uses)})"]:
                    print(f"        {command}")
            return 0
        if args.cmd == "report":
            print(write_report(args.docs))
            return 0
        claims = list(all_claims().values()) if args.ids == ["all"] else [get_claim(i) for i in args.ids]
        done = {c.id for c in claims}
        for claim in claims:
            for dep in claim.uses:  # a claim that reads another's runs: run that one first if it is missing
                if dep not in done and not (args.out / dep).is_dir():
                    run_claim(get_claim(dep), args.out, args.docs, args.quick)
                    done.add(dep)
            run_claim(claim, args.out, args.docs, args.quick, args.analyze_only)
        if not args.quick:
            print(write_report(args.docs))
        return 0
    except (ClaimRunError, RuntimeError) as e:  # a run or its analysis failed
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, LookupError, OSError) as e:  # a bad id, a damaged or missing file, a folder not writable
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
