"""Every bench module imports, every comparison runs through ``python -m bench --quick`` (one timed round) and prints
its tables, and so does the CPU part of the GPU check (``bench/gpu_check.py --smoke``).

The numbers are not checked (the suite shares its cores): the tables are, row by row, as a reader gets them.
"""

import importlib
import math
import os
import subprocess
import sys

import pytest
from helpers import run_bench_quick

from attnlab.core.paths import ROOT
from bench.__main__ import COMPARISONS
from bench.common import fast_bf16
from preloaded_python import run as run_python

MODULES = [*COMPARISONS.values(), "gpu_check", "models", "common"]

# P3, P5 (test_bench.py) and P8 (test_bench_p8.py) run there, with checks of their own
RUN_ELSEWHERE = {"P3", "P5", "P8"}
# one command each; P7 reads P2's Lightning runs, so the two share one (as `python -m bench` does)
RUNS = ["P1", "P2,P7", "P4", "P6", "P9", "P10"]


def tables(out: str) -> dict[str, list[list[str]]]:
    """Every table the bench printed: its title -> its rows of stripped cells, the header first (the |---| line
    left out)."""
    lines = out.splitlines()
    found = {}
    for i, line in enumerate(lines):
        if line.startswith("**") and line.endswith("**"):
            rows = []
            for row in lines[i + 2:]:  # the title, a blank line, the table
                if not row.startswith("|"):
                    break
                if not row.startswith("|---"):
                    rows.append([cell.strip() for cell in row.split("|")[1:-1]])
            found[line.strip("*")] = rows
    return found


def rows_of(out: str, name: str) -> list[list[list[str]]]:
    """The tables of comparison ``name`` (their titles start with it), each checked for shape: a header, at least one
    row, every row as wide as the header, no cell that reads nan or inf (a zero time divided into a ratio)."""
    found = [rows for title, rows in tables(out).items() if title.startswith(f"{name} ")]
    assert found, f"no {name} table in\n{out[-3000:]}"
    for rows in found:
        header, *body = rows
        assert body, f"{name}: a table without rows"
        assert all(len(row) == len(header) for row in body), (name, header, body)
        bad = [c for row in body for c in row if c.lower().rstrip("×%") in ("nan", "inf", "-inf")]
        assert not bad, (name, bad)
    assert f"({name} took " in out
    return found


def column(rows: list[list[str]], name: str) -> list[str]:
    header, *body = rows
    return [row[header.index(name)] for row in body]


def is_ratio(cell: str) -> bool:
    """A measured ratio as the tables print it: a positive finite number and ×, e.g. 1.05×."""
    try:
        value = float(cell.removesuffix("×").replace(",", ""))
    except ValueError:
        return False
    return cell.endswith("×") and math.isfinite(value) and value > 0


def check_p1(out):
    (rows,) = rows_of(out, "P1")
    assert column(rows, "precision") == ["fp32"] + (["bf16"] if fast_bf16() else [])
    assert all(is_ratio(r) for r in column(rows, "ratio ours/torch layers"))
    assert is_ratio(column(rows, "ratio ours/before")[0])  # fp32 always runs the "before" side


def check_p2(out):
    (rows,) = rows_of(out, "P2")
    *sides, ratio = rows[1:]
    assert len(sides) == 2 and all(float(row[1].replace(",", "")) > 0 for row in sides)
    assert ratio[0].startswith("ratio Lightning/plain") and is_ratio(ratio[1])


def check_p7(out):
    (rows,) = rows_of(out, "P7")
    within = column(rows, "within 10%")
    assert len(within) == 4 and set(within) <= {"yes", "no"}


def check_p4(out):
    (rows,) = rows_of(out, "P4")
    assert column(rows, "batch") == ["1", "8"]
    assert is_ratio(column(rows, "ratio cache/no-cache")[0])  # batch 1 also decodes without the cache


def check_p6(out):
    (rows,) = rows_of(out, "P6")
    assert [(m.split(" ")[0], b) for m, b in zip(column(rows, "model"), column(rows, "sentences"))] == [
        ("transformer_mt", "1"), ("causal", "1"), ("transformer_mt", "4"), ("causal", "4")]
    assert all(is_ratio(r) for r in column(rows, "ratio recompute/cache"))
    assert set(column(rows, "same best hypothesis")) <= {"yes", "no (float ties)"}


def check_p9(out):
    (rows,) = rows_of(out, "P9")
    assert column(rows, "kernels") == ["torch eager"]  # --quick leaves the compiled rows out
    assert is_ratio(column(rows, "RMSNorm / LayerNorm")[0])


def check_p10(out):
    callback, tts = rows_of(out, "P10")
    configs = column(callback, "callback")
    assert len(configs) == 5 and configs[-1].startswith("default: PNG + explorer + health")
    ms = [float(cell.replace(",", "")) for cell in column(tts, "ms per interval")]
    assert len(ms) == 2 and min(ms) > 0


CHECKS = {"P1": check_p1, "P2": check_p2, "P4": check_p4, "P6": check_p6, "P7": check_p7, "P9": check_p9,
          "P10": check_p10}


@pytest.mark.parametrize("module", MODULES)
def test_bench_module_imports(module):
    importlib.import_module(f"bench.{module}")


def test_every_comparison_runs_in_the_suite():
    ran_here = [name for run in RUNS for name in run.split(",")]
    assert sorted(ran_here + sorted(RUN_ELSEWHERE)) == sorted(COMPARISONS)
    assert set(CHECKS) == set(ran_here)


# the two longest (P6, P10: 17-20 s each) in -m slow, which CI runs (.ci/run), to keep the suite under 10 minutes
@pytest.mark.parametrize("only", [pytest.param(r, marks=pytest.mark.slow) if r in ("P6", "P10") else r for r in RUNS])
def test_quick_run_prints_every_table(only, cache_dir):
    out = run_bench_quick(only, cache_dir)
    assert "Traceback" not in out, out[-3000:]
    for name in only.split(","):
        CHECKS[name](out)


def markdown_table(out: str, heading: str) -> list[list[str]]:
    """The table printed under the ``### heading`` line: header first, the |---| line left out."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"### {heading}"))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("###"):
            break
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.split("|")[1:-1]])
    return rows


def test_gpu_check_smoke_prints_its_tables():
    """The GPU check's code at toy sizes on CPU: the LM step with compile off and on, each SDPA backend a CPU has."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    out = run_python([sys.executable, "bench/gpu_check.py", "--smoke"], cwd=ROOT,
                     env={**os.environ, "PYTHONPATH": path}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    header, *rows = markdown_table(out.stdout, "bf16 LM train step")
    assert header == ["compile", "tokens/s", "MFU", "step ms"]
    assert [r[0] for r in rows] == ["False", "True"]
    assert all(float(r[1].replace(",", "")) > 0 and float(r[3]) > 0 for r in rows), rows
    header, *rows = markdown_table(out.stdout, "SDPA backends")
    assert header == ["T", "backend", "fwd+bwd ms", "peak MiB"]
    assert [(r[0], r[1]) for r in rows] == [(t, b) for t in ("128", "256") for b in ("flash", "math")]
    assert not [r for r in rows if r[2].startswith("failed")], rows  # every backend a CPU has runs there
    assert all(float(r[2]) > 0 for r in rows), rows
