"""PreemptionCheckpoint: a real signal during training -> checkpoint at a step boundary -> clean exit 0 -> resuming
continues from exactly that step. In-process with signal.raise_signal, then train.py in a subprocess with
proc.send_signal (SIGTERM and SIGUSR1)."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import Deadline, compose_train, exactly_equal, run_cli
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from attnlab.callbacks.preemption import PreemptionCheckpoint, preemption_signal
from attnlab.core.paths import ROOT
from attnlab.cli.train import run


# ----------------------------------------------------------------------------------------------------------------
# in process: a tiny module that raises a real signal while it computes step `signal_at`
# ----------------------------------------------------------------------------------------------------------------
class Tiny(L.LightningModule):
    def __init__(self, signal_at: int | None = None, signum: int = signal.SIGUSR1, signal_in_validation: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)
        self.signal_at, self.signum, self.signal_in_validation = signal_at, signum, signal_in_validation
        self.val_batches_after_signal = 0
        self.signalled = False

    def training_step(self, batch, batch_idx):
        if not self.signal_in_validation and self.global_step == self.signal_at and not self.signalled:
            self.signalled = True
            signal.raise_signal(self.signum)  # arrives in the middle of this step (before backward and update)
        x, y = batch
        return nn.functional.mse_loss(self.layer(x).squeeze(-1), y)

    def validation_step(self, batch, batch_idx):
        if self.signalled:
            self.val_batches_after_signal += 1
        if self.signal_in_validation and self.global_step == self.signal_at and not self.signalled:
            self.signalled = True
            signal.raise_signal(self.signum)
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x).squeeze(-1), y))

    def _loader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(-1)), batch_size=4)  # 16 batches

    def train_dataloader(self):
        return self._loader()

    def val_dataloader(self):
        return self._loader()

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.99)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _fit(tmp_path: Path, model: Tiny, ckpt_path: str | None = None, **kwargs) -> tuple[L.Trainer, PreemptionCheckpoint]:
    pre = PreemptionCheckpoint()
    mc = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True, monitor="val_loss")
    trainer = L.Trainer(**{"max_epochs": 3, "min_epochs": 2, "accelerator": "cpu", "devices": 1, "logger": False,
                           "enable_progress_bar": False, "enable_model_summary": False,
                           "num_sanity_val_steps": 0, "default_root_dir": tmp_path, **kwargs},
                        callbacks=[pre, mc])
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, pre


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_during_a_step_checkpoints_after_it_and_stops(tmp_path, signum):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    model = Tiny(signal_at=5, signum=signum)
    trainer, pre = _fit(tmp_path, model)  # min_epochs=2 must not keep it running
    name = signal.Signals(signum).name
    assert pre.preempted == name and preemption_signal(trainer) == name
    assert trainer.global_step == 6  # the step the signal interrupted finished, and nothing after it
    assert model.val_batches_after_signal == 0  # no validation after the signal: exit within the grace period
    ckpt_dir = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["PREEMPTED", "last.ckpt"]  # no last-v1.ckpt
    saved = torch.load(ckpt_dir / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 6 and saved["optimizer_states"] and saved["lr_schedulers"]
    assert (ckpt_dir / "PREEMPTED").read_text() == f"signal={name} step=6 checkpoint={ckpt_dir / 'last.ckpt'}\n"
    # the handlers from before fit are back (Lightning's SIGTERM handler is gone again too)
    assert {s: signal.getsignal(s) for s in before} == before

    # resume: exactly 3 more steps, from step 6
    resumed, pre2 = _fit(tmp_path / "resumed", Tiny(), ckpt_path=str(ckpt_dir / "last.ckpt"), max_steps=9)
    assert resumed.global_step == 9 and pre2.preempted is None


def test_signal_during_validation_checkpoints_at_its_end(tmp_path):
    model = Tiny(signal_at=16, signal_in_validation=True)  # the end-of-epoch validation after step 16
    trainer, pre = _fit(tmp_path, model)
    assert pre.preempted == "SIGUSR1"
    assert trainer.global_step == 16  # no training step after the validation
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 16


def test_no_signal_no_trace(tmp_path):
    trainer, pre = _fit(tmp_path, Tiny(), max_epochs=1, min_epochs=1)
    assert pre.preempted is None and trainer.global_step == 16
    assert not (tmp_path / "checkpoints" / "PREEMPTED").exists()


def test_arguments():
    assert PreemptionCheckpoint(signals=["TERM", 10, "sigusr1"]).signals == [signal.SIGTERM, signal.SIGUSR1]
    with pytest.raises(ValueError):
        PreemptionCheckpoint(signals=["SIGNOPE"])
    with pytest.raises(ValueError):
        PreemptionCheckpoint(check_every_n_steps=0)


# ----------------------------------------------------------------------------------------------------------------
# train.py in a subprocess, a real signal from outside
# ----------------------------------------------------------------------------------------------------------------
# `callbacks=[default,preemption]` adds conf/callbacks/preemption.yaml to the chosen group (`+callbacks=preemption`
# is refused: the group already has a value); it stays valid once default.yaml lists preemption itself.
COMMON = ["debug=fast", "logger=csv", "callbacks=[default,preemption]", "callbacks.rich_progress_bar=null",
          "trainer.enable_progress_bar=false", "trainer.max_epochs=50", "trainer.limit_train_batches=1000", "test=false"]
RUN = ["model=causal_lm", *COMMON]
LINE = re.compile(r"received (SIG\w+) at step (\d+): checkpoint written to (\S+); exiting")


@pytest.fixture(scope="module")
def warm_cache(cache_dir) -> str:
    """Tokenizer and token ids of debug=fast in the cache, so the timed runs below only load them."""
    from attnlab.data.lm_datamodule import LMDataModule

    LMDataModule(vocab_size=512, seq_len=32, batch_size=8, cache_dir=cache_dir).prepare_data()
    return cache_dir


def _logged_steps(run_dir: Path) -> int:
    files = list(run_dir.glob("csv/version_*/metrics.csv"))
    if not files:
        return -1
    with open(files[0]) as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")]
    return max(steps, default=-1)


def _leftover_processes(run_dir: Path, wait: float = 10.0) -> list[int]:
    """Processes still running with this run directory on their command line (killed, so that none leaks)."""
    def find() -> list[int]:
        pids = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if str(run_dir).encode() in cmdline.read_bytes():
                    pids.append(int(cmdline.parent.name))
            except OSError:
                pass
        return pids

    deadline = Deadline(wait)
    while (pids := find()) and not deadline.passed():
        time.sleep(0.2)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


def _preempt_train_py(tmp_path: Path, cache_dir: str, signame: str, extra: list[str] = (),
                      base: list[str] = RUN, start_timeout: float = 40) -> tuple[int, Path]:
    """Start train.py, signal it once training steps are logged, check the clean exit; (step, checkpoint)."""
    run_dir, log_path = tmp_path / "run", tmp_path / "train.out"
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1", "ATTNLAB_CACHE": cache_dir}
    env.pop("PYTEST_XDIST_WORKER", None)
    # the CSV logger writes its file every 4 steps: our cue that training is under way
    args = [*base, *extra, "+logger.csv.flush_logs_every_n_steps=4", f"hydra.run.dir={run_dir}"]
    with open(log_path, "w") as out:
        proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            deadline = Deadline(start_timeout)
            while _logged_steps(run_dir) < 3:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert not deadline.passed(), (f"no training steps logged within {deadline}\n"
                                               + log_path.read_text()[-3000:])
                time.sleep(0.2)
            seen = _logged_steps(run_dir)
            proc.send_signal(getattr(signal, signame))  # to this process only (rank 0 under DDP)
            rc = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                _leftover_processes(run_dir, wait=0)
    output = log_path.read_text()
    assert rc == 0, output[-3000:]
    assert not _leftover_processes(run_dir), "a process of the run (a DDP rank) did not stop"
    (match,) = LINE.findall(output)
    step, ckpt = int(match[1]), Path(match[2])
    assert match[0] == signame and ckpt == run_dir / "checkpoints" / "last.ckpt"
    assert step > seen  # a later step boundary than the last one logged before the signal
    assert torch.load(ckpt, weights_only=True)["global_step"] == step > 0
    assert (run_dir / "checkpoints" / "PREEMPTED").read_text() == f"signal={signame} step={step} checkpoint={ckpt}\n"
    assert not list((run_dir / "checkpoints").glob("last-v*.ckpt"))
    return step, ckpt


@pytest.mark.parametrize("signame", [pytest.param("SIGTERM", marks=pytest.mark.slow), "SIGUSR1"])  # SIGTERM: test_resume_anywhere
def test_train_py_preempted_by_a_signal_exits_0_and_resumes_at_that_step(tmp_path, warm_cache, signame):
    step, ckpt = _preempt_train_py(tmp_path, warm_cache, signame)
    # resume from it: exactly 3 more optimizer steps, none lost or repeated
    # (in this process: the same config and code path as `python train.py ... ckpt_path=...`, without the start-up)
    run(compose_train([*RUN, f"ckpt_path={ckpt}", f"trainer.max_steps={step + 3}"], tmp_path / "resumed", warm_cache))
    final = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["global_step"] == step + 3


# `-m slow` (the suite's 10-minute budget): the default suite stops the default family by every signal in every
# phase (tests/test_resume_anywhere.py) and resumes every family exactly in-process (tests/test_exact_resume.py)
@pytest.mark.slow
@pytest.mark.parametrize("model", ["transformer_mt", "seq2seq_attention", "vit", "tts"])
def test_every_model_family_preempted_by_sigterm_resumes_at_that_step(tmp_path, cache_dir, model):
    """The same fault for the other families: translation (transformer and RNN), ViT and TTS, each with its data.
    Their first run also builds its data set in the cache, hence the longer start-up allowance."""
    base = [f"model={model}", *COMMON]
    step, ckpt = _preempt_train_py(tmp_path, cache_dir, "SIGTERM", base=base, start_timeout=120)
    run(compose_train([*base, f"ckpt_path={ckpt}", f"trainer.max_steps={step + 2}"], tmp_path / "resumed", cache_dir))
    final = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["global_step"] == step + 2


@pytest.mark.slow
def test_ddp_kill_of_rank_0_only_stops_both_ranks_at_the_same_step(tmp_path, warm_cache):
    """`kill <rank 0>`: rank 1 gets no signal; the per-step all-reduce makes it save and stop with rank 0."""
    _preempt_train_py(tmp_path, warm_cache, "SIGTERM", ["trainer=ddp_cpu"])  # checks exit 0, no rank left
    rank1 = (tmp_path / "run" / "ddp_rank1.log").read_text()
    assert "Traceback" not in rank1 and "Error" not in rank1


@pytest.mark.slow  # the suite's 10-minute budget: tests/test_resume_anywhere.py stops before the first checkpoint by default
def test_preempted_before_the_first_checkpoint_then_resume_auto_keeps_last_ckpt_the_newest(tmp_path, warm_cache):
    """SIGTERM in the first epoch, before ModelCheckpoint ever saved: `resume=auto` in the same folder must finish
    into last.ckpt (no last-v1.ckpt beside a stale one), identical to a straight run of as many steps.

    The LR schedule's length is fixed (`total_steps`) so that the straight run's `max_steps` changes nothing but
    where it stops."""
    base = [*RUN, "model.net.n_layers=1", "callbacks.attention_maps=null", "trainer.limit_val_batches=1",
            "+sched.total_steps=1000"]
    step, ckpt = _preempt_train_py(tmp_path, warm_cache, "SIGTERM", base=base)
    run_dir = ckpt.parent.parent
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["PREEMPTED", "last.ckpt"]  # nothing saved before
    stop = [f"trainer.max_steps={step + 3}", "+logger.csv.flush_logs_every_n_steps=4"]
    resumed = run_cli([*base, *stop, "resume=auto", f"hydra.run.dir={run_dir}"], warm_cache)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    straight = run_cli([*base, *stop, f"hydra.run.dir={tmp_path / 'straight'}"], warm_cache)
    assert straight.returncode == 0, straight.stdout[-3000:]

    assert not list(ckpt.parent.glob("last-v*.ckpt"))
    got = torch.load(ckpt, weights_only=False)
    want = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=False)
    assert got["global_step"] == want["global_step"] == step + 3
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert exactly_equal(got[key], want[key]), key
