"""Shared checks for tests that run train.py as a user does: tiny settings, one-line refusals, unchanged files."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

# a few seconds of training: 1 layer, 2 steps, 1 validation batch, the slow callbacks off, CSV logs
TINY = ["model=causal_lm", "debug=fast", "model.net.n_layers=1", "trainer.max_steps=2", "trainer.limit_val_batches=1",
        "callbacks.attention_maps=null", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
        "test=false", "logger=csv"]


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
