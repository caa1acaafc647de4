"""``python -m bench --quick`` on a cheap subset prints tables with their ratio columns (a smoke test)."""

import os
import subprocess
import sys

import pytest
from helpers import run_bench_quick

from attnlab.core.paths import ROOT
from preloaded_python import run as run_python


@pytest.fixture(scope="module")
def quick_output() -> str:
    return run_bench_quick("P3,P5")


def test_machine_facts(quick_output):
    for fact in ("cores", "cpu flags", "amx_bf16", "torch:", "date (UTC)", "threads chosen"):
        assert fact in quick_output


def test_tables_have_ratio_columns(quick_output):
    assert "**P3 attention" in quick_output and "**P5 MoE" in quick_output
    header_p3 = next(l for l in quick_output.splitlines() if l.startswith("| T |"))
    assert "ratio explicit/fast (time)" in header_p3 and "ratio explicit/fast (memory)" in header_p3
    assert "ratio to dense" in quick_output and "ratio naive / sort-group" in quick_output
    # every P5 data row carries a ratio like 2.31×
    rows = [l for l in quick_output.splitlines() if l.startswith("| MoE")]
    assert len(rows) == 2 and all("×" in r for r in rows)


def test_unknown_comparison_is_refused():
    out = run_python([sys.executable, "-m", "bench", "--only", "P99"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"})
    assert out.returncode == 2 and "unknown comparison" in out.stdout
