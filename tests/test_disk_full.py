"""Property: a disk that fills up while a run writes any of its files is one line and exit 2, and loses nothing.

For each writer of ``python train.py`` (the data cache: corpus export, tokenizer, token shards; a checkpoint; the
run's JSON files; the attention explorer page; train.log) the disk fills up in the middle of that file, simulated
at Python's file layer by ``tests/disk_full/sitecustomize.py`` (``OSError(ENOSPC)`` once a matching file got N
bytes, as ``write(2)`` answers on a full disk); and once on a real full disk (a small tmpfs in a mount namespace).
Each run must exit 2 with one line naming the file, the space it needed and the space free; no temporary file
stays; the file under its final name is the previous complete one (``last.ckpt`` of the epoch before, the explorer
page of the epoch before) or absent.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import TINY, one_error_line
from helpers import run_cli

from attnlab.core.paths import ROOT
from attnlab.runs.resume import check_intact

FAULT = Path(__file__).resolve().parent / "disk_full"
EPOCHS = [*TINY, "trainer.max_steps=-1", "trainer.limit_train_batches=2"]  # 2 steps an epoch; no test
# writer -> (the file the disk fills up in (a part of its path), how many such files are written first, overrides)
WRITERS = {
    "cache": ("{cache}", 0, []),  # the first file of an empty cache (the corpus export, then tokenizer, shards)
    "cache_shards": ("shard-", 0, []),  # the token shards (corpus and tokenizer already written)
    "checkpoint": ("last.ckpt", 1, []),  # epoch 1's last.ckpt: epoch 0's must stay
    "metrics_json": ("metrics.json", 0, []),
    "job_status_json": ("job_status.json", 0, []),
    "csv_log": ("metrics.csv", 0, []),  # Lightning's CSV logger (not ours: appended to, not renamed)
    "explorer_html": ("explorer.html", 1, ["callbacks.attention_maps.health=false"]),  # epoch 1's page: epoch 0's
    "train_log": ("train.log", 0, []),  # Python logging's file, its first line (before training starts)
}
SLOW = {"cache_shards", "job_status_json", "csv_log", "explorer_html", "metrics_json"}  # the same writers' code as
# "cache" and "checkpoint" (atomic temp-and-rename writes)


@pytest.mark.parametrize("writer", [pytest.param(w, marks=pytest.mark.slow) if w in SLOW else w for w in WRITERS])
def test_a_disk_full_in_any_writer_is_one_line_and_loses_nothing(writer, tmp_path, cache_dir):
    match, skip, extra = WRITERS[writer]
    cache = str(tmp_path / "cache") if writer.startswith("cache") else cache_dir
    match = match.format(cache=cache)
    run = tmp_path / "run"
    env = {"PYTHONPATH": os.pathsep.join([str(FAULT), os.environ.get("PYTHONPATH", "")]),
           "ATTNLAB_DISK_FULL": json.dumps({"match": match, "skip": skip, "after": 64})}
    base = [a for a in EPOCHS if not (writer == "explorer_html" and a.startswith("callbacks.attention_maps"))]
    epochs = f"trainer.max_epochs={skip + 1}"  # the file is written once an epoch: the last epoch's write fails
    out = run_cli([*base, epochs, *extra, f"hydra.run.dir={run}"], cache, env=env)
    assert out.returncode == 2, out.stdout[-3000:]
    line = one_error_line(out.stdout, "disk full: cannot write")
    assert match in line and "needs" in line and "free there" in line, line

    written = list(Path(cache).rglob("*") if writer.startswith("cache") else run.rglob("*"))
    assert not [p for p in written if p.name.endswith(".tmp")], written  # no temporary file or folder stays
    failed = Path(line.split("cannot write ")[1].split(" (needs")[0])
    assert "Logging error" not in out.stdout, out.stdout[-3000:]  # not logging's own report of a failed write
    if writer == "train_log":  # stopped at the first batch: no epoch ended, nothing else was written
        assert (run / "train.log").is_file() and not (run / "checkpoints" / "last.ckpt").exists()
        assert not (run / "metrics.json").exists()
        return
    if writer == "csv_log":  # a logger's file, appended to: only the one line is promised
        return
    if skip:  # the previous complete file is still there under its name
        assert failed.is_file()
        if failed.suffix == ".ckpt":
            check_intact(failed)
            import torch

            assert torch.load(failed, weights_only=True, map_location="cpu")["global_step"] == 2
        else:
            from attnlab.explorer.page import read_payload

            assert len(read_payload(failed)["epochs"]) == 1
    else:
        assert not failed.exists()  # never a partial file under the final name


def _tmpfs_available() -> bool:
    """A mount namespace of our own in which a size-limited tmpfs can be mounted (``unshare -m``)."""
    if shutil.which("unshare") is None:
        return False
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs \"$d\" && umount \"$d\"; s=$?; rmdir \"$d\"; exit $s"
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True).returncode == 0


# where the small disk is mounted -> (its size, overrides, the file the one line names): the run folder holds epoch
# 0's files (last.ckpt and its copy epoch_000.ckpt, 405 kB each) and not epoch 1's last.ckpt as well; W&B's folder
# does not hold its debug.log
REAL_DISKS = {
    "run_folder": ("1000k", ["hydra.run.dir={disk}/run"], "last.ckpt"),
    "wandb_folder": ("4k", ["logger=wandb", "logger.wandb.save_dir={disk}"], "debug.log"),
}


@pytest.mark.skipif(not _tmpfs_available(), reason="no tmpfs can be mounted here (`unshare -m`)")
@pytest.mark.parametrize("where", REAL_DISKS)
def test_a_real_full_disk_is_one_line_and_keeps_the_last_checkpoint(where, tmp_path, cache_dir):
    """The same promise on a real full disk, not a simulated one: a size-limited tmpfs mounted in a mount namespace
    of its own, under the run folder or under W&B's folder (whose own debug.log handler would print logging's
    traceback for every record). The run stops in one line naming the file, exit 2; last.ckpt, if written, is epoch
    0's and intact; no temporary file stays. The folder is copied out before the namespace and its tmpfs go away."""
    size, overrides, named = REAL_DISKS[where]
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    run = disk / "run" if where == "run_folder" else tmp_path / "run"
    overrides = [o.format(disk=disk) for o in overrides]
    train = [sys.executable, "train.py", *EPOCHS, "trainer.max_epochs=2", f"hydra.run.dir={run}", *overrides]
    script = (f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(disk))} || exit 99; {shlex.join(train)}; "
              f"rc=$?; cp -a {shlex.quote(str(run))} {shlex.quote(str(kept))}; exit $rc")
    env = {**os.environ, "WANDB_SILENT": "true", "ATTNLAB_CACHE": cache_dir, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == 2, out.stdout[-3000:]
    line = one_error_line(out.stdout, "disk full: cannot write")
    assert f"{named} (" in line and str(disk) in line and "free there" in line, line
    assert "Logging error" not in out.stdout, out.stdout[-3000:]
    assert not [p for p in kept.rglob("*") if p.name.endswith(".tmp")]
    last = kept / "checkpoints" / "last.ckpt"
    if where == "run_folder":
        check_intact(last)
        import torch

        assert torch.load(last, weights_only=True, map_location="cpu")["global_step"] == 2
    else:  # stopped at the first batch after W&B started: no epoch ended
        assert not last.exists()
