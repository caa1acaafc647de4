"""Sweep isolation: one failing job does not stop the others; the sweep ends with a summary naming it."""

from __future__ import annotations

from helpers import run_cli


def test_failing_job_is_isolated_and_summarized(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    # job 0 fails inside Lightning (not on a check of ours, so its traceback is kept in its log); job 1 is fine
    out = run_cli(["-m", "model=causal_lm", "debug=fast", "logger=csv", "trainer.limit_train_batches=-1,8",
                   f"hydra.sweep.dir={sweep}"], cache_dir)
    assert out.returncode == 1  # the sweep as a whole reports the failure
    assert (sweep / "1" / "checkpoints" / "last.ckpt").is_file()  # the other job ran to the end
    summary = (sweep / "sweep_summary.md").read_text()
    assert "1 of 2 jobs completed, 1 failed" in summary
    failed_row = next(line for line in summary.splitlines() if line.startswith("| 0 |"))
    assert "trainer.limit_train_batches=-1" in failed_row
    assert "MisconfigurationException: You have passed invalid value -1 for limit_train_batches" in failed_row
    ok_row = next(line for line in summary.splitlines() if line.startswith("| 1 |"))
    assert "completed" in ok_row
    assert "Traceback" in (sweep / "0" / "train.log").read_text()  # the full error is kept in the job's log


def test_config_error_in_sweep_is_one_line(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    out = run_cli(["-m", "model=tts", "debug=fast", "logger=csv", "pos=rotary,alibi",
                   f"hydra.sweep.dir={sweep}"], cache_dir, timeout=120)
    assert out.returncode == 1
    summary = (sweep / "sweep_summary.md").read_text()
    assert summary.count("pos= does not apply to model=tts") == 2
