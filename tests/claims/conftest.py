"""One real quick claim run (E9: two tiny GPT trainings) shared by the framework and notebook tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.core.paths import ROOT
from preloaded_python import run as run_python

# experiments/ is a top-level folder of the repository, importable from its root (as `python -m experiments.claims`
# is run): the same for the tests whatever directory pytest was started from
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def quick_e9(tmp_path_factory, cache_dir) -> tuple[Path, subprocess.CompletedProcess]:
    """`python -m experiments.claims run E9 --quick --out <tmp>`: (the --out folder, the finished process)."""
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    out = tmp_path_factory.mktemp("claims")
    proc = run_python([sys.executable, "-m", "experiments.claims", "run", "E9", "--quick", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return out, proc
