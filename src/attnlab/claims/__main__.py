"""``python -m attnlab.claims ...``: deprecated; forwards to ``python -m experiments.claims ...`` (the claims moved out
of the package into the repository's ``experiments/``, importable from the repository root only)."""

from __future__ import annotations

import sys

NEW = "python -m experiments.claims"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        from experiments.claims.__main__ import main as claims_main
    except ModuleNotFoundError as e:
        if e.name not in ("experiments", "experiments.claims"):
            raise
        print(f"error: the claims moved out of the package: run `{NEW} {' '.join(argv) or 'list'}` from the root of "
              "a checkout of the repository", file=sys.stderr)
        return 2
    print(f"note: `python -m attnlab.claims` is deprecated; use `{NEW} {' '.join(argv)}`", file=sys.stderr)
    return claims_main(argv)


if __name__ == "__main__":
    sys.exit(main())
