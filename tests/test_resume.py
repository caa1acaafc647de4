"""resume=auto / resume=<run dir>: same folder, step count continues, same W&B run id; only a run of the same model,
never a damaged checkpoint, and overrides the restored state ignores are named."""

from __future__ import annotations

import csv
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from cli_checks import TINY, one_error_line, snapshot
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


# ----------------------------------------------------------------------------------------------------------------
# which run resume= continues, and what it refuses (one line, exit 2, nothing written into the run)
# ----------------------------------------------------------------------------------------------------------------
EPOCH = [*TINY, "trainer.max_steps=-1"]  # debug=fast's one epoch of 8 steps: epoch_000.ckpt and last.ckpt


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, cache_dir) -> Path:
    """A finished causal_lm run (8 steps, epoch_000.ckpt and last.ckpt) in its own runs folder."""
    log_dir = tmp_path_factory.mktemp("lm_runs")
    out = run_cli([*EPOCH, f"paths.log_dir={log_dir}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    (run,) = (log_dir / "debug" / "runs").iterdir()
    return run


def test_resume_auto_continues_only_a_run_of_the_same_model_and_writes_nothing_into_others(lm_run, cache_dir):
    """The order of docs/reliability.md: a ViT run, then `resume=auto` of another model must not touch it."""
    lm_runs = lm_run.parent.parent.parent
    vit = run_cli(["model=vit", *TINY[1:], f"paths.log_dir={lm_runs}"], cache_dir)  # newer than the LM run
    assert vit.returncode == 0, vit.stdout[-3000:]
    (vit_run,) = [p for p in (lm_runs / "debug" / "runs").iterdir() if p != lm_run]
    runs_before = sorted((lm_runs / "debug" / "runs").iterdir())
    vit_files, lm_files = snapshot(vit_run), snapshot(lm_run)

    # no run of transformer_mt: refused, naming the newest run it skipped; no folder created
    other = run_cli(["model=transformer_mt", *TINY[1:], f"paths.log_dir={lm_runs}", "resume=auto"], cache_dir)
    assert other.returncode == 2, other.stdout[-3000:]
    line = one_error_line(other.stdout, "resume=auto: no run with checkpoints/last.ckpt under")
    assert "of model=transformer_mt" in line and f"skipped the newest run {vit_run}" in line
    assert "model=vit there, model=transformer_mt here" in line
    assert sorted((lm_runs / "debug" / "runs").iterdir()) == runs_before
    assert snapshot(vit_run) == vit_files and snapshot(lm_run) == lm_files

    # its own run with another optimizer: refused (the checkpoint holds AdamW's state), nothing written
    sgd = run_cli([*EPOCH, f"paths.log_dir={lm_runs}", "resume=auto", "optim=sgd"], cache_dir)
    assert sgd.returncode == 2, sgd.stdout[-3000:]
    line = one_error_line(sgd.stdout, f"{lm_run} was trained with another optimizer")
    assert "optim._target_=torch.optim.AdamW there, torch.optim.SGD here" in line
    assert snapshot(lm_run) == lm_files and sorted((lm_runs / "debug" / "runs").iterdir()) == runs_before

    # causal_lm: its own run, not the newer ViT one; a changed learning rate is named as not applied
    resumed = run_cli([*EPOCH, f"paths.log_dir={lm_runs}", "resume=auto", "trainer.max_epochs=2",
                       "model.optimizer.lr=0.5", "model.scheduler.warmup_steps=3"], cache_dir)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"resuming {lm_run} (resume=auto: the newest run of model=causal_lm with this model.net); newer runs " \
           f"of other models skipped: {vit_run.name} (model=vit)" in resumed.stdout
    assert snapshot(vit_run) == vit_files
    assert sorted((lm_runs / "debug" / "runs").iterdir()) == runs_before
    assert "resume: model.optimizer.lr=0.5 (first part: 0.002): NOT applied" in resumed.stdout
    assert "resume: model.scheduler.warmup_steps=3 (first part: 2): applied from the resumed step on" in resumed.stdout
    assert torch.load(lm_run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 16
    # the warning is true: the second part trained at the first part's rate (the schedule's peak is 0.002)
    (second_part,) = (lm_run / "csv").glob("version_1/metrics.csv")
    with open(second_part) as f:
        lrs = [float(v) for r in csv.DictReader(f) for k, v in r.items() if k.startswith("lr-") and v]
    assert lrs and max(lrs) <= 0.002


def test_resume_from_a_damaged_last_ckpt_names_it_and_an_intact_one(lm_run, cache_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # truncated, as by a crash mid-copy
    before = snapshot(run)
    out = run_cli([*EPOCH, f"resume={run}"], cache_dir, timeout=120)
    assert out.returncode == 2, out.stdout[-3000:]
    line = one_error_line(out.stdout, f"checkpoint {last} is damaged")
    # (epoch_000.ckpt, or epoch_001.ckpt once the test above has continued the run)
    intact = re.search(r"continue from the intact (epoch_\d{3}\.ckpt) with resume=(\S+)$", line)
    assert intact and Path(intact[2]) == run / "checkpoints" / intact[1] and Path(intact[2]).is_file(), line
    assert snapshot(run) == before  # the damaged file and the whole run untouched

    # the hint works, and the continued run's newest state is last.ckpt again (no last-v1.ckpt beside it)
    cont = run_cli([*EPOCH, f"resume={intact[2]}", "trainer.max_epochs=3"], cache_dir)
    assert cont.returncode == 0, cont.stdout[-3000:]
    assert torch.load(last, weights_only=True)["global_step"] == 24  # 3 epochs of 8 steps
    assert not list(last.parent.glob("last-v*.ckpt"))


def test_resume_says_when_it_takes_a_newer_last_v1_ckpt(lm_run, cache_dir, tmp_path):
    """Two writers of one folder (or an older preemption callback) left last-v1.ckpt newer than last.ckpt."""
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    ckpts = run / "checkpoints"
    shutil.copy(ckpts / "last.ckpt", ckpts / "last-v1.ckpt")
    os.utime(ckpts / "last.ckpt", (1e9, 1e9))  # older
    out = run_cli([*EPOCH, f"resume={run}", "train=false"], cache_dir, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:]
    assert f"resuming from {ckpts / 'last-v1.ckpt'}: it is newer than last.ckpt" in out.stdout


@pytest.mark.parametrize("source", ["numbers", "tsv"])
def test_another_tokenizer_says_why_for_generated_and_for_given_data(source):
    """A run of the numbers data from before they changed cannot be continued (the user cannot restore generated
    data); a corpus the user gave can be restored."""
    from types import SimpleNamespace

    from attnlab.core.errors import ResumeError
    from attnlab.checkpoints.read import read_trusted
    from attnlab.runs.resume import check_tokenizer
    from attnlab.tasks.base import saved_tokenizer

    fixtures = Path(__file__).resolve().parent / "fixtures"
    other = saved_tokenizer(torch.load(fixtures / "legacy_causal_lm.ckpt", weights_only=True))
    datamodule = SimpleNamespace(tokenizer=other, hparams={"source": source})
    with pytest.raises(ResumeError) as refused:
        check_tokenizer(read_trusted(fixtures / "legacy_transformer_mt.ckpt"), datamodule, "resume")
    message = str(refused.value)
    assert ("generates the numbers data differently" in message) == (source == "numbers")
    assert ("restore it" in message) == (source != "numbers")
