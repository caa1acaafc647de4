"""notebooks/review_run.ipynb runs top to bottom, headless, on a run directory made by the real `python train.py`,
for every model family: the default translation job logged to W&B offline (executed docs/notebooks.md's way, `jupyter
nbconvert --execute` with ATTNLAB_RUN_DIR) and, with `-m slow`, the language model with the CSV logger (nbclient,
parameters cell), the NAT and RNN translators, the ViT, TTS and the sequence classifier."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from attnlab.families import families
from preloaded_python import run as run_python

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
QUIET = ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]

# what the review shows beyond "family: <kind>" for some families: (overrides on top of the family's test overrides,
# text, images at least); every other registered family is reviewed with the defaults
EXTRA = {
    "transformer_mt": (["model=transformer_mt"], ["| source | greedy | beam 5 |",
                                                  "translations/epoch000-step000008.tsv"], 4),
    "causal_lm": (["logger=csv"], ["--- sample 0 ---", "--- sample 1 ---"], 3),
    "transformer_nat": ([], ["NATTranslationTask", "| source | greedy | beam 5 |"], 4),
    "seq2seq_attention": (["model.net.d_emb=16", "model.net.d_hidden=32"],
                          ["Seq2SeqRNN", "| source | greedy | beam 5 |"], 2),
    "vit": ([], ["confusion_matrix/test.png"], 5),
    "tts": (["trainer.limit_train_batches=4", "model.free_running_samples=2"],
            ["tts_samples/epoch000_mel.png", "tts_samples/epoch000.wav"], 5),
}
# family -> (train.py overrides on top of debug=fast, text the review must show, images it must show at least)
FAMILIES = {f.name: ([f"model={f.name}", *f.test_overrides, *EXTRA.get(f.name, ([], [], 1))[0]],
                     [f"family: {f.kind}", *EXTRA.get(f.name, ([], [], 1))[1]], EXTRA.get(f.name, ([], [], 1))[2])
            for f in families()}
IN_DEFAULT_SUITE = ("transformer_mt",)  # the default job (W&B offline curves); the others add ~2.5 min: -m slow


def kernel_env() -> dict[str, str]:
    """What the notebook's kernel inherits: inline figures as in Jupyter whatever backend the environment sets, and
    one torch thread (two threads on a shared 2-core machine made the LM's sampling cell 20x slower)."""
    return {"MPLBACKEND": "module://matplotlib_inline.backend_inline", "OMP_NUM_THREADS": "1"}


def train(run_dir: Path, overrides: list[str], cache_dir: str) -> None:
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = run_python([sys.executable, "train.py", "debug=fast", *QUIET, *overrides, f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert (run_dir / "checkpoints" / "last.ckpt").is_file(), proc.stdout[-4000:]


@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=() if name in IN_DEFAULT_SUITE else pytest.mark.slow) for name in FAMILIES])
def family_run(request, tmp_path_factory, cache_dir) -> tuple[str, Path]:
    """A finished `python train.py debug=fast ...` run directory of one model family."""
    run_dir = tmp_path_factory.mktemp(request.param) / "run"
    train(run_dir, FAMILIES[request.param][0], cache_dir)
    return request.param, run_dir


def parameter_cell(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    return tagged[0]


def outputs_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts += [out.get("data", {}).get(k, "") for k in ("text/plain", "text/markdown", "text/html")]
    return "\n".join(parts)


def images(nb: nbformat.NotebookNode) -> list:
    return [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]


def execute_with_nbconvert(run_dir: Path, out_dir: Path) -> nbformat.NotebookNode:
    """docs/notebooks.md's command: `ATTNLAB_RUN_DIR=<run> jupyter nbconvert --to notebook --execute ...`."""
    env = {**os.environ, **kernel_env(), "ATTNLAB_RUN_DIR": str(run_dir)}
    proc = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                           "notebooks/review_run.ipynb", "--output-dir", str(out_dir)],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]  # nbconvert exits non-zero on a cell error
    return nbformat.read(out_dir / "review_run.ipynb", as_version=4)


def execute_with_nbclient(run_dir: Path, monkeypatch) -> nbformat.NotebookNode:
    """As a test harness (or papermill) would: the parameters cell replaced."""
    nb = nbformat.read(NOTEBOOKS / "review_run.ipynb", as_version=4)
    parameter_cell(nb).source = f"RUN_DIR = {str(run_dir)!r}"
    for key, value in kernel_env().items():
        monkeypatch.setenv(key, value)
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()  # raises on a cell error
    return nb


def test_review_run_parameter_cell_defaults_to_newest_run():
    nb = nbformat.read(NOTEBOOKS / "review_run.ipynb", as_version=4)
    nbformat.validate(nb)
    assert parameter_cell(nb).source.splitlines()[-1].strip() == 'RUN_DIR = os.environ.get("ATTNLAB_RUN_DIR") or None'
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook cleared"


def test_review_run_names_only_registered_family_kinds():
    """The notebook branches on ``family``, a registered Family's ``kind`` ("text-to-speech model"): a name that is
    no kind (a family renamed, a word left out) skips that family's curve panel and outputs without an error."""
    named = set()
    for cell in nbformat.read(NOTEBOOKS / "review_run.ipynb", as_version=4).cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "family":
                named |= {c.value for side in node.comparators for c in ast.walk(side)
                          if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            elif isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["PANEL"]:
                named |= {k.value for k in node.value.keys}
    assert len(named) >= 5 and named <= {f.kind for f in families()}, named - {f.kind for f in families()}


def test_review_run_executes_for_each_family(family_run, tmp_path, monkeypatch):
    family, run_dir = family_run
    _, expected, min_images = FAMILIES[family]
    if family == "transformer_mt":
        nb = execute_with_nbconvert(run_dir, tmp_path)
    else:
        nb = execute_with_nbclient(run_dir, monkeypatch)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    text = outputs_text(nb)
    assert f"run directory: {run_dir.resolve()}" in text
    for snippet in expected:
        assert snippet in text, (snippet, text[-3000:])
    # the curves: the W&B offline history (the default logger) or the CSV logger's, never "no curves"
    source = "csv/version_0/metrics.csv" if "logger=csv" in FAMILIES[family][0] else "/run-"
    assert f"curves from: {run_dir.resolve()}" in text and source in text, text[:3000]
    assert "no curves to draw" not in text and "final metrics (metrics.json):" in text
    if family == "tts":
        assert any("<audio" in o.get("data", {}).get("text/html", "") for c in nb.cells for o in c.get("outputs", []))
    assert len(images(nb)) >= min_images  # curves + attention maps (+ the family's own figures)


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
    monkeypatch.setattr("attnlab.core.paths.ROOT", tmp_path)
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
