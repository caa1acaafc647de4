"""notebooks/claims.ipynb and notebooks/review_sweep.ipynb run top to bottom, headless, on a real quick claim run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from experiments.claims import all_claims
from attnlab.core.paths import ROOT

NOTEBOOKS = ROOT / "notebooks"


def run_notebook(name: str, parameters: str, monkeypatch) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook cleared"
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    cell.source = parameters
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()  # raises on a cell error
    return nb


def outputs(nb, kind: str) -> list:
    return [o for c in nb.cells for o in c.get("outputs", []) if kind in o.get("data", {})]


def text(nb) -> str:
    return "\n".join(o.get("text", "") + "".join(o.get("data", {}).get(k, "") for k in ("text/plain", "text/markdown"))
                     for c in nb.cells for o in c.get("outputs", []))


@pytest.mark.slow  # the 10-minute budget: test_claims_notebook_on_committed_results runs the notebook by default
def test_claims_notebook(quick_e9, tmp_path, monkeypatch):
    out, proc = quick_e9
    assert proc.returncode == 0, proc.stderr[-2000:]
    docs = tmp_path / "docs"
    (docs / "results").mkdir(parents=True)
    (docs / "figures").mkdir()
    record = json.loads((out / "E9" / "E9.json").read_text())
    record["figure"] = "figures/E9.png"
    (docs / "results" / "E9.json").write_text(json.dumps(record))
    shutil.copy(out / "E9" / "E9.png", docs / "figures" / "E9.png")
    nb = run_notebook("claims.ipynb", f"DOCS_DIR = {str(docs)!r}", monkeypatch)
    shown = text(nb)
    assert f"1 of {len(all_claims())} claims have results" in shown
    assert record["evidence"] in shown
    assert ("not run yet" in shown) == (len(all_claims()) > 1)
    assert len(outputs(nb, "image/png")) == 1  # E9's figure, the only result


@pytest.mark.skipif(not any((ROOT / "docs" / "results").glob("E*.json")), reason="no committed results yet")
def test_claims_notebook_on_committed_results(monkeypatch):
    """The committed docs/: every result renders with its figure."""
    committed = sorted((ROOT / "docs" / "results").glob("E*.json"))
    nb = run_notebook("claims.ipynb", "DOCS_DIR = None", monkeypatch)
    assert len(outputs(nb, "image/png")) == len(committed)
    for path in committed:
        assert json.loads(path.read_text())["evidence"] in text(nb)


@pytest.mark.slow  # the suite's 10-minute budget
def test_review_sweep_notebook(quick_e9, monkeypatch):
    out, proc = quick_e9
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep = out / "E9" / "0"
    nb = run_notebook("review_sweep.ipynb", f'SWEEP_DIR = {str(sweep)!r}\nMETRIC, LOWER_IS_BETTER = "val/loss", True'
                      '\nBY = "norm"', monkeypatch)
    shown = text(nb)
    assert f"sweep: {sweep.resolve()} (4 jobs)" in shown  # 2 norms × 2 seeds (E9 --quick)
    assert "| job | norm | seed | val/loss |" in shown  # only the varying overrides, then the metrics
    # the settings over their seeds: python -m attnlab.compare's table
    assert "| norm | n | seeds | val/loss (mean ± std) | Δ vs pre | 95% CI | p (Welch) | significant |" in shown
    assert "| rms | 2 | 0,1 |" in shown
    assert "best job by val/loss" in shown
    assert len(outputs(nb, "image/png")) >= 3  # the curves with bands, all the curves, at least one attention map
    assert "'The " in shown  # a generation from the best job's checkpoint
