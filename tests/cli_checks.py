"""Shared checks for tests that run train.py as a user does: tiny settings, one-line refusals, unchanged files."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

# a few seconds of training: 1 layer, 2 steps, 1 validation batch, the slow callbacks off, CSV logs
TINY = ["model=causal_lm", "debug=fast", "model.net.n_layers=1", "trainer.max_steps=2", "trainer.limit_val_batches=1",
        "callbacks.attention_maps=null", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
        "test=false", "logger=csv"]
# debug=fast's one epoch of 8 steps: epoch_000.ckpt and last.ckpt
EPOCH = [*TINY, "trainer.max_steps=-1"]


def finished_run(tmp_path_factory, cache_dir: str) -> Path:
    """A finished causal_lm run of one epoch (module fixtures share it; tests copy it, never modify it)."""
    from helpers import run_cli

    run = tmp_path_factory.mktemp("finished") / "run"
    out = run_cli([*EPOCH, f"hydra.run.dir={run}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    return run


def copy_of(run: Path, where: Path) -> Path:
    """A copy of a run folder (its links, if any, as links)."""
    shutil.copytree(run, where, symlinks=True)
    return where


def one_error_line(output: str, text: str) -> str:
    """The one output line containing ``text``; asserts there is exactly one and no traceback."""
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if text in line]
    assert len(lines) == 1, (text, output[-3000:])
    return re.sub(r"\x1b\[[0-9;]*m", "", lines[0])  # without colorlog's colours


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its SHA-256, to show that a run left them byte-identical."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}
