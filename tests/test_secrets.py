"""No W&B API key (or other secret from the environment) ends up in a run's saved configs, logs or W&B files."""

from __future__ import annotations

import os
import sys

from attnlab.core.paths import ROOT
from preloaded_python import run as run_python

SECRET = "sk-test-0123456789abcdef0123456789abcdef"


def test_api_key_in_environment_is_not_written_anywhere(tmp_path, cache_dir):
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1",
           "WANDB_API_KEY": SECRET, "HF_TOKEN": SECRET}
    run_dir = tmp_path / "run"
    proc = run_python([sys.executable, "train.py", "model=causal_lm", "debug=fast", "logger=wandb",
                           "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
                           f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert SECRET not in proc.stdout + proc.stderr
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files) and any(p.suffix == ".ckpt" for p in files)
    leaked = [str(p.relative_to(run_dir)) for p in files if SECRET.encode() in p.read_bytes()]
    assert not leaked, f"secret written to {leaked}"
