"""resume=auto / resume=<run dir>: same folder, step count continues, same W&B run id."""

from __future__ import annotations

import torch
from helpers import run_cli


def test_resume_auto_continues_the_newest_run_under_the_same_wandb_id(tmp_path, cache_dir):
    log_dir = tmp_path / "outputs"
    first = run_cli(["model=causal_lm", "debug=fast", f"paths.log_dir={log_dir}", "test=false"], cache_dir)
    assert first.returncode == 0, first.stdout[-3000:]
    (run_dir,) = (log_dir / "debug" / "runs").iterdir()
    (run1,) = (run_dir / "wandb").glob("offline-run-*")
    second = run_cli(["model=causal_lm", "debug=fast", f"paths.log_dir={log_dir}", "test=false", "resume=auto",
                      "trainer.max_epochs=2"], cache_dir)
    assert second.returncode == 0, second.stdout[-3000:]
    assert [p.name for p in (log_dir / "debug" / "runs").iterdir()] == [run_dir.name]  # no new folder
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 16
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and {r.name.rsplit("-", 1)[-1] for r in runs} == {run1.name.rsplit("-", 1)[-1]}


def test_resume_with_nothing_to_resume_is_one_line(tmp_path, cache_dir):
    out = run_cli(["model=causal_lm", "debug=fast", f"paths.log_dir={tmp_path}", "resume=auto"], cache_dir, timeout=120)
    assert out.returncode == 2
    assert "resume=auto: no run with checkpoints/last.ckpt under" in out.stdout
    assert "Traceback" not in out.stdout
