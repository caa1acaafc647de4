"""The notebooks run top to bottom, headless, against a run directory made by the real `python train.py`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory, cache_dir) -> Path:
    """A finished `python train.py debug=fast logger=csv` run directory."""
    run_dir = tmp_path_factory.mktemp("nb") / "run"
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "train.py", "model=causal_lm", "debug=fast", "logger=csv", f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert (run_dir / "checkpoints" / "last.ckpt").is_file(), proc.stdout[-4000:]
    return run_dir


def parameter_cell(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    return tagged[0]


def outputs_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def test_review_run_parameter_cell_defaults_to_newest_run():
    nb = nbformat.read(NOTEBOOKS / "review_run.ipynb", as_version=4)
    nbformat.validate(nb)
    assert parameter_cell(nb).source.splitlines()[-1].strip() == "RUN_DIR = None"
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook cleared"


def test_review_run_executes(fast_run, monkeypatch):
    nb = nbformat.read(NOTEBOOKS / "review_run.ipynb", as_version=4)
    parameter_cell(nb).source = f"RUN_DIR = {str(fast_run)!r}"
    # the kernel inherits this: inline figures as in Jupyter, whatever backend the environment sets
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()  # raises on a cell error
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    text = outputs_text(nb)
    assert "sample" in text
    assert "--- sample 0 ---" in text and "--- sample 1 ---" in text
    assert str(fast_run) in text
    assert "skipping the loss curves" not in text  # the CSV logger's metrics were found
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 2  # the loss curves and the attention maps


def _touch_ckpt(run: Path, mtime: float) -> None:
    ckpt = run / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"")
    os.utime(ckpt, (mtime, mtime))


def test_review_run_default_run_dir_is_newest_with_last_ckpt(tmp_path, monkeypatch):
    """RUN_DIR = None: the run (or sweep job) under outputs/ whose last.ckpt is newest. Runs the notebook's
    run-selection cell in-process against a fake repository root (no kernel, no training)."""
    nb = nbformat.read(NOTEBOOKS / "review_run.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and "def newest_run" in c.source]
    monkeypatch.setattr("attnlab.paths.ROOT", tmp_path)
    outputs = tmp_path / "outputs"

    def select(run_dir=None) -> Path:
        ns = {"RUN_DIR": run_dir}
        exec(compile(cell.source, "review_run.ipynb", "exec"), ns)  # noqa: S102
        return ns["run_dir"]

    outputs.mkdir()
    with pytest.raises(FileNotFoundError, match="no run with checkpoints/last.ckpt"):
        select()
    _touch_ckpt(outputs / "train" / "runs" / "2026-01-01_10-00-00", 1_000_000)
    _touch_ckpt(outputs / "debug" / "runs" / "2026-01-02_10-00-00", 2_000_000)
    _touch_ckpt(outputs / "train" / "multiruns" / "2026-01-01_09-00-00" / "3", 3_000_000)
    (outputs / "train" / "runs" / "2026-01-03_10-00-00" / "checkpoints").mkdir(parents=True)  # no last.ckpt
    assert select() == (outputs / "train" / "multiruns" / "2026-01-01_09-00-00" / "3").resolve()
    # an explicit RUN_DIR wins; a relative one is taken from the repository root
    assert select("outputs/debug/runs/2026-01-02_10-00-00") == (outputs / "debug/runs/2026-01-02_10-00-00").resolve()
    with pytest.raises(FileNotFoundError, match="no such directory"):
        select(str(tmp_path / "missing"))
