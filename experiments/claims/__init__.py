"""The seeds' claims (E1–E18 of docs/claims.md) as experiments: one command each, a number, a figure, a verdict.

Each claim is a module ``eNN_<topic>.py`` holding ``CLAIM`` (a :class:`~experiments.claims.base.Claim`): the
training commands it runs (``conf/experiment/eNN_*.yaml`` sweeps) and the analysis that turns the runs' logged
metrics into a table, a figure and a verdict. From the repository root, ``python -m experiments.claims run E9`` runs
one, ``python -m experiments.claims report`` writes docs/results.md from the saved results. See docs/claims.md.
Measurements that are not specific to a claim live in the package (:mod:`attnlab.analysis`).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Claim, Context, Result

__all__ = ["Claim", "Context", "Result", "all_claims", "get_claim", "normalize_id"]


def normalize_id(text: str) -> str:
    """'e9', 'E09', '9' -> 'E9'; a one-line error for anything else."""
    digits = text.strip().upper().removeprefix("E")
    if not digits.isdigit():
        raise ValueError(f"not a claim id: {text!r} (expected E1 … E18)")
    return f"E{int(digits)}"


def all_claims() -> dict[str, Claim]:
    """Every ``eNN_*`` module's CLAIM, by id, in numeric order."""
    found: dict[str, Claim] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name[0] == "e" and info.name[1:3].isdigit():
            claim = importlib.import_module(f"{__name__}.{info.name}").CLAIM
            found[claim.id] = claim
    return dict(sorted(found.items(), key=lambda kv: int(kv[0][1:])))


def get_claim(text: str) -> Claim:
    cid = normalize_id(text)
    claims = all_claims()
    if cid not in claims:
        raise ValueError(f"claim {cid} has no experiment yet; available: {', '.join(claims) or 'none'}")
    return claims[cid]
