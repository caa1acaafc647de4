"""Every claim end to end with --quick (tiny models, a few steps): its commands run, its analysis reads the runs,
draws a figure and returns a well-formed result. Slow (~20 s per claim on 2 cores): `python -m pytest -m slow
tests/claims`. The default suite runs E9 this way (test_framework.py) and composes every claim's jobs."""

from __future__ import annotations

import json
import os
import sys

import pytest

from experiments.claims import all_claims
from experiments.claims.base import VERDICTS
from attnlab.core.paths import ROOT
from preloaded_python import run as run_python


@pytest.mark.slow
@pytest.mark.parametrize("cid", list(all_claims()))
def test_claim_quick(cid, tmp_path, cache_dir):
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = run_python([sys.executable, "-m", "experiments.claims", "run", cid, "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / cid / f"{cid}.json").read_text())
    assert record["verdict"] in VERDICTS and record["headline"] and record["evidence"] and record["rows"]
    assert len({tuple(r) for r in record["rows"]}) == 1, "every row of the table has the same columns"
    assert (tmp_path / cid / record["figure"]).stat().st_size > 5_000
