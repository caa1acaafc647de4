"""A disk that fills up while checkpointing: one-line error, and the checkpoint already written is kept intact.

The fault is real: the second run's process gets a file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored), so the
kernel refuses the checkpoint's writes with EFBIG exactly as a full disk refuses them with ENOSPC.
"""

from __future__ import annotations

import os
import resource
import signal
import sys

import pytest
import torch

from attnlab.core.paths import ROOT
from attnlab.files.checkpoint_io import AtomicCheckpointIO
from preloaded_python import run as run_python

RUN = ["model=causal_lm", "debug=fast", "logger=csv", "callbacks.rich_progress_bar=null",
       "trainer.enable_progress_bar=false", "test=false"]


def test_atomic_save_round_trip_leaves_no_temporary_file(tmp_path):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"w": torch.arange(3)}, tmp_path / "ck" / "last.ckpt")
    assert torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)["w"].tolist() == [0, 1, 2]
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["last.ckpt"]


@pytest.mark.slow  # the suite's 10-minute budget: tests/test_disk_full.py fills the disk under last.ckpt through train.py
def test_full_disk_while_checkpointing_keeps_last_ckpt(tmp_path, cache_dir):
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "run"
    first = run_python([sys.executable, "train.py", *RUN, f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    last = run_dir / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    limit = len(before) // 2  # logs fit, a checkpoint does not

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    second = run_python(
        [sys.executable, "train.py", *RUN, f"resume={run_dir}", "trainer.max_epochs=2"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300, preexec_fn=small_disk)
    out = second.stdout + second.stderr
    assert second.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert len([line for line in out.splitlines() if "cannot write checkpoint" in line]) == 1, out[-3000:]
    assert last.read_bytes() == before  # the finished epoch's checkpoint survived, byte for byte
    assert torch.load(last, weights_only=True)["global_step"] == 8
    assert not list(run_dir.glob("checkpoints/.*.tmp"))
