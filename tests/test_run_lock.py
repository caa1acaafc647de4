"""The run folder through the real train.py: one run per folder (a lock with the pid; a dead run's lock is taken
over), a folder that cannot be created is named in one line, a refused run leaves no folder behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cli_checks import TINY, one_error_line, snapshot
from helpers import Deadline, run_cli

from attnlab.core.paths import ROOT
from preloaded_python import run as run_python


def _start(args: list[str], cache_dir: str, log_path) -> subprocess.Popen:
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1", "ATTNLAB_CACHE": cache_dir}
    env.pop("PYTEST_XDIST_WORKER", None)
    with open(log_path, "w") as out:
        return subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def test_second_run_in_the_same_folder_is_refused_and_a_dead_runs_lock_is_taken_over(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    # the first run trains "forever" (epochs of 2 batches, a checkpoint after each) until it is killed below
    first = _start([*TINY, "trainer.max_steps=100000", "trainer.max_epochs=100000", "trainer.limit_train_batches=2",
                    f"hydra.run.dir={run_dir}"], cache_dir, tmp_path / "first.out")
    try:
        deadline = Deadline(120)
        while not (run_dir / "checkpoints" / "last.ckpt").is_file():  # training has started
            assert first.poll() is None, (tmp_path / "first.out").read_text()[-3000:]
            assert not deadline.passed(), (f"no checkpoint within {deadline}\n"
                                           + (tmp_path / "first.out").read_text()[-3000:])
            time.sleep(0.2)
        assert (run_dir / ".lock").read_text().strip() == str(first.pid)
        before = snapshot(run_dir / ".hydra")

        for extra in ([], [f"resume={run_dir}"]):  # a new run, and a resume of the live run
            second = run_cli([*TINY, *extra, f"hydra.run.dir={run_dir}"], cache_dir, timeout=120)
            assert second.returncode == 2, second.stdout[-3000:]
            line = one_error_line(second.stdout, "is in use by another run")
            assert f"run folder {run_dir} is in use by another run (pid {first.pid}" in line
        assert snapshot(run_dir / ".hydra") == before  # the first run's config is untouched
        assert first.poll() is None  # and it still runs
    finally:
        first.send_signal(signal.SIGKILL)  # no clean exit: the lock file with its pid stays behind
        first.wait()
    assert (run_dir / ".lock").read_text().strip() == str(first.pid)

    # continuing the killed run takes over its dead lock, with a note; released (removed) at the end
    third = run_cli([*TINY, "train=false", f"resume={run_dir}"], cache_dir, timeout=120)
    assert third.returncode == 0, third.stdout[-3000:]
    assert f"taking over {run_dir / '.lock'}: its run (pid {first.pid}) is no longer running" in third.stdout
    assert not (run_dir / ".lock").exists()


def test_an_uncreatable_run_folder_is_named_in_one_line(tmp_path, cache_dir):
    blocker = tmp_path / "file.txt"  # a folder under a regular file cannot be created, even by root
    blocker.write_text("not a folder")
    out = run_cli([*TINY, f"hydra.run.dir={blocker}/run"], cache_dir, timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    line = one_error_line(out.stdout, "cannot create or write the run folder")
    assert f"{blocker}/run: Not a directory" in line
    sweep = run_cli(["-m", *TINY, "norm=pre,rms", f"hydra.sweep.dir={blocker}/sweep"], cache_dir, timeout=120)
    assert sweep.returncode == 2, sweep.stdout[-3000:]
    one_error_line(sweep.stdout, f"cannot create or write the run folder {blocker}/sweep")
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("script", ["translate.py", "generate.py", "synthesize.py"])
def test_inference_clis_name_an_uncreatable_run_folder_in_one_line(script, tmp_path):
    """Before any checkpoint is read (the one given does not exist): one line, exit 2, not Hydra's traceback."""
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    extra = {"synthesize.py": ["text=hi"], "generate.py": ["prompt=hi"]}.get(script, [])
    out = run_python([sys.executable, script, f"ckpt={tmp_path}/none.ckpt", *extra,
                          f"hydra.run.dir={blocker}/run"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HYDRA_FULL_ERROR": "0"}, stdin=subprocess.DEVNULL)
    assert out.returncode == 2, (out.stdout + out.stderr)[-3000:]
    line = one_error_line(out.stdout + out.stderr, "cannot create or write the run folder")
    assert f"{blocker}/run: Not a directory" in line and blocker.read_text() == "not a folder"


def test_a_refused_run_leaves_no_folder_but_never_removes_an_earlier_one(tmp_path, cache_dir):
    refused = ["model=seq2seq_attention", "norm=rms"]  # the RNN model is not built from norm blocks
    out = run_cli([*refused, f"hydra.run.dir={tmp_path}/new/run"], cache_dir, timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    one_error_line(out.stdout, "norm= does not apply to model=seq2seq_attention")
    assert not (tmp_path / "new").exists()  # neither the run folder nor the folder made for it

    earlier = tmp_path / "earlier"  # made before the run (empty: a folder that holds anything is refused earlier)
    earlier.mkdir()
    out = run_cli([*refused, f"hydra.run.dir={earlier}"], cache_dir, timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    one_error_line(out.stdout, "norm= does not apply to model=seq2seq_attention")
    assert earlier.is_dir() and not list(earlier.iterdir())
