"""Checkpoint and stop cleanly when the scheduler signals a preemption or an approaching time limit.

:class:`PreemptionCheckpoint` turns ``SIGTERM`` (preemption; also ``kill <pid>``) and ``SIGUSR1`` (SLURM's warning
before the time limit, ``#SBATCH --signal=USR1@120``) into:

    signal during training -> full checkpoint at the next finished optimizer step -> clean end of ``fit``
    (exit code 0) -> ``python train.py ckpt_path=<that checkpoint>`` continues from exactly that step.

``SIGINT`` (Ctrl+C) is handled the same way when configured (conf/callbacks/preemption.yaml does): ``train.py`` then
exits with 130; a second Ctrl+C raises ``KeyboardInterrupt`` at once (Lightning's interrupt path, no checkpoint),
except once the epoch's validation has finished: its checkpoint comes next, so the second one is said to wait for it
and only a third stops without it.

The handler only records the signal. At the next ``on_train_batch_end`` that finished an optimizer step the callback
does the following; a signal seen at an epoch's last step or during its validation waits for that epoch's end
(``on_train_epoch_end``), where the checkpoint callbacks write ``last.ckpt`` and the epoch's top-k file: a checkpoint
between an epoch's last step and its validation is one Lightning cannot resume exactly (docs/reliability.md,
"Exact resume"). At that point the callback

1. saves ``trainer.save_checkpoint(<dirpath>/<filename>)``: weights, optimizer and scheduler state, loop progress,
   callback states — the same kind of checkpoint ``ModelCheckpoint`` writes, so resuming loses no finished step
   (``ModelCheckpoint`` is told, before the save so that the checkpoint carries it, that this step is saved and,
   when its ``last.ckpt`` is this file, that this is its last checkpoint: it neither writes the step again nor adds
   a ``last-v1.ckpt`` next to it, in this run or in the resumed one);
2. writes ``<dirpath>/PREEMPTED`` (``signal=SIGTERM step=N checkpoint=...``) for job scripts that requeue;
3. logs ``received SIGTERM at step N: checkpoint written to ...; exiting``;
4. sets ``trainer.should_stop`` so that ``fit`` returns normally (no pending validation is run; ``min_epochs`` /
   ``min_steps`` are lifted for this run — Lightning would otherwise ignore ``should_stop`` in the first epoch
   because this repo's trainer config has ``min_epochs: 1``), and sets ``self.preempted = "SIGTERM"`` so that the
   entry point can skip testing (:func:`preemption_signal`).

Lightning's own signal handling (2.6, ``trainer/connectors/signal_connector.py``)
--------------------------------------------------------------------------------
At the start of every ``fit`` (after ``on_fit_start``) Lightning installs a SIGTERM handler that forwards the signal
to DDP processes it launched, under DDP calls ``dist.broadcast`` from inside the handler, and sets
``trainer.received_sigterm``; its loops then raise ``SIGTERMException`` (a ``SystemExit``) after the current batch,
in the middle of validation, or at epoch end: the run ends through the exception path (loggers finalized as
"failed", no checkpoint unless ``OnExceptionCheckpoint``). SIGUSR1 it handles only under SLURM with auto-requeue,
and only if no handler exists yet: it saves ``hpc_ckpt_N.ckpt`` from inside the handler (mid-step) and runs
``scontrol requeue``. Lightning restores the handlers it found when ``fit`` ends (normally or by an exception).

This callback installs its handlers at ``on_train_start``, i.e. *after* Lightning's, replacing them for the
configured signals while training runs; at ``on_train_end`` / ``on_exception`` it puts Lightning's back, and
Lightning's teardown then restores the handlers from before ``fit`` — so after ``fit`` the process has exactly the
handlers it had before. Consequences: during training Lightning never sees these signals (no
``SIGTERMException``, no broadcast inside a signal handler, no mid-step hpc checkpoint); before ``on_train_start``
(setup, sanity check) Lightning's/the default behaviour applies — nothing has been trained then. Under SLURM with
auto-requeue a warning says that requeueing is the job script's business (requeue when ``PREEMPTED`` exists and
resume with ``ckpt_path=``); with this repo's timestamped run directories Lightning's hpc auto-resume would not find
its checkpoint anyway.

DDP
---
Which ranks receive a signal depends on who sends it: SLURM (``scancel``, preemption, ``--signal``) and torchrun
signal every rank, a user's ``kill <pid>`` only one. ``trainer.save_checkpoint`` is collective (a barrier), so the
ranks must agree on the step. When ``world_size > 1`` the callback therefore all-reduces (MAX) the received signal
number at each step boundary — one tiny collective (and a device->host read) every ``check_every_n_steps``
optimizer steps, on the same steps on every rank; on a single process there is no collective and the flag is
read every step for free. All ranks then save together (rank 0 writes), stop together, and agree on
``preempted``.

Resuming mid-epoch: the global step, optimizer and scheduler state and the loop progress continue exactly; this repo's
train dataloader is not stateful, so Lightning restarts the epoch's data from its beginning (it warns so).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

import lightning as L
import torch
from ..files.atomic import write_atomic
from ..core.quoting import shell_override
from ..core.errors import at_least

__all__ = ["PreemptionCheckpoint", "TestInterrupted", "preemption_signal"]

log = logging.getLogger(__name__)

MARKER = "PREEMPTED"
_POSIX_SIGNALS = {"SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGCONT", "SIGXCPU"}


def _signum(sig: str | int) -> signal.Signals | None:
    """``"SIGTERM"``, ``"TERM"``, ``"sigterm"`` or ``15`` -> ``signal.SIGTERM``; None if this platform lacks it."""
    if isinstance(sig, int):
        return signal.Signals(sig)
    name = str(sig).upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    if hasattr(signal.Signals, name):
        return signal.Signals[name]
    if name in _POSIX_SIGNALS:  # e.g. SIGUSR1 on Windows
        return None
    raise ValueError(f"unknown signal {sig!r}")


def preemption_signal(trainer: L.Trainer) -> str | None:
    """The signal name if a :class:`PreemptionCheckpoint` of this trainer stopped the run, else None."""
    for cb in trainer.callbacks:
        if isinstance(cb, PreemptionCheckpoint) and cb.preempted:
            return cb.preempted
    return None


class TestInterrupted(Exception):
    """One of the signals arrived during ``trainer.test``: raised at the end of the test batch that saw it (the
    training state is all in ``last.ckpt``, nothing to save); ``train.py`` marks the run interrupted and exits as for
    a stop in training, and ``resume=`` runs the test again."""

    def __init__(self, signame: str):
        super().__init__(f"the test was stopped by {signame}")
        self.signame = signame


class PreemptionCheckpoint(L.Callback):
    """On one of ``signals``: checkpoint at the next finished optimizer step, write a marker, stop cleanly.

    Args:
        signals: signal names (or numbers) to handle during training.
        dirpath: where the checkpoint and the ``PREEMPTED`` marker go; default: the ``ModelCheckpoint``'s
            ``dirpath``, else ``<default_root_dir>/checkpoints``.
        filename: checkpoint file name (default ``last.ckpt``, the file one resumes from).
        check_every_n_steps: under DDP, agree on a received signal every N optimizer steps (one all-reduce each
            time); a single process checks its flag every step at no cost.

    Attributes:
        preempted: the signal name once the run was stopped by one (on every rank), else None.
        ckpt_path: the checkpoint written on preemption.
    """

    def __init__(
        self,
        signals: Sequence[str | int] = ("SIGTERM", "SIGUSR1"),
        dirpath: str | Path | None = None,
        filename: str = "last.ckpt",
        check_every_n_steps: int = 1,
    ):
        super().__init__()
        at_least("check_every_n_steps", check_every_n_steps, 1)
        resolved = [_signum(s) for s in signals]
        missing = [str(s) for s, r in zip(signals, resolved) if r is None]
        if missing:
            log.warning(f"PreemptionCheckpoint: this platform has no {', '.join(missing)}; not handled")
        self.signals: list[signal.Signals] = list(dict.fromkeys(r for r in resolved if r is not None))
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.filename = filename
        self.check_every_n_steps = check_every_n_steps
        self.preempted: str | None = None
        self.ckpt_path: Path | None = None
        self._received: int = 0  # signal number recorded by the handler (0: none)
        self._replaced: dict[signal.Signals, Any] = {}
        self._step_at_batch_start = -1
        self._dir: Path | None = None
        self._at_epoch_end = 0  # a signal seen at the epoch's last step or in its validation: stop at its end
        self._epoch_validated = False  # the epoch's end-of-training validation is done: its checkpoint comes next
        self._interrupts = 0  # Ctrl+C presses while a stop is pending

    # ------------------------------------------------------------------ handlers
    def _handler(self, signum: int, frame: Any) -> None:
        # Only record: the work happens at the next step boundary, outside the signal handler.
        if not self._received:
            self._received = int(signum)
        elif signum == signal.SIGINT:
            self._interrupts += 1
            if self._epoch_validated and self._interrupts == 1:  # the complete epoch is moments from its checkpoint
                sys.stderr.write("Ctrl+C again: the epoch is validated and its checkpoint is being written; "
                                 "a third Ctrl+C stops without it\n")
                return
            raise KeyboardInterrupt  # Ctrl+C twice: stop now, without the checkpoint (Lightning's interrupt path)

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("PreemptionCheckpoint: not in the main thread, signal handlers not installed")
            return
        for signum in self.signals:
            self._replaced[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handler)

    def _restore(self) -> None:
        """Put back the handlers found at ``on_train_start`` (Lightning's; it restores the pre-fit ones itself)."""
        replaced, self._replaced = self._replaced, {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in replaced.items():
            if signal.getsignal(signum) == self._handler:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    # ------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # (not on_train_start: a resumed run whose training was already complete goes straight to its test)
        self._dir = self._resolve_dir(trainer)
        if trainer.is_global_zero:
            stale = self._dir / MARKER
            if stale.exists():  # a previous run in this directory was preempted; this one continues
                log.info(f"removing {stale} left by a previous preempted run")
                stale.unlink(missing_ok=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.preempted, self.ckpt_path, self._received, self._at_epoch_end = None, None, 0, None
        self._interrupts = 0
        self._dir = self._resolve_dir(trainer)
        self._warn_if_slurm_requeue(trainer)
        self._install()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_validated = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch_loop = trainer.fit_loop.epoch_loop
        if not trainer.sanity_checking and trainer.state.fn == "fit" and \
                getattr(epoch_loop, "_num_ready_batches_reached", lambda: False)():
            self._epoch_validated = True

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A signal in the epoch's last step or its validation: stop now that the epoch is complete. The checkpoint
        # callbacks, which Lightning runs after this one, write last.ckpt (and the epoch's top-k) at this point.
        if self.preempted or not self._replaced:
            return
        signum = self._at_epoch_end or self._agree(trainer)
        if signum:
            self.preempted, self._at_epoch_end = signal.Signals(signum).name, signum
            self._stop(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._at_epoch_end and self.preempted:
            assert self._dir is not None
            path = self._dir / self.filename
            if not self._written_by_a_checkpoint_callback(trainer, path):
                trainer.save_checkpoint(path)  # collective under DDP (barrier); rank 0 writes
            self._report(trainer, self.preempted, path)
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()

    # the test phase: no state to save; stop after the batch that saw the signal (Lightning's own SIGTERM handler
    # would end the run through a SystemExit that says nothing, and its Ctrl+C path exits 1)
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._received, self._interrupts, self._epoch_validated = 0, 0, False
        self._install()

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.world_size > 1 and batch_idx % self.check_every_n_steps:
            return
        signum = self._agree(trainer)
        if signum:
            self.preempted = signal.Signals(signum).name
            self._restore()
            raise TestInterrupted(self.preempted)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._step_at_batch_start:
            return  # accumulating gradients: no optimizer step finished with this batch
        if trainer.world_size > 1 and trainer.global_step % self.check_every_n_steps:
            return
        if self.preempted or self._at_epoch_end:
            return
        signum = self._agree(trainer)
        if not signum:
            return
        epoch_loop = trainer.fit_loop.epoch_loop
        if getattr(epoch_loop, "_num_ready_batches_reached", lambda: False)():
            # The epoch's last step: its validation and epoch-end checkpoint follow (no more training); a
            # checkpoint here, between the step and the validation, is one Lightning cannot resume exactly.
            self._at_epoch_end = signum
            return
        self._preempt(trainer, signal.Signals(signum).name)
        # end now: no validation that `should_stop` would otherwise trigger (it may outlast the grace period)
        if hasattr(epoch_loop, "_skip_next_val"):
            epoch_loop._skip_next_val = True

    # ------------------------------------------------------------------ work
    def _agree(self, trainer: L.Trainer) -> int:
        """The signal received (0: none); under DDP every rank takes part, on the same steps, and all agree on the
        largest signal number."""
        signum = self._received
        if trainer.world_size > 1:
            flag = torch.tensor(signum, dtype=torch.int64, device=trainer.strategy.root_device)
            signum = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        return signum

    def _preempt(self, trainer: L.Trainer, name: str) -> None:
        assert self._dir is not None
        path = self._dir / self.filename
        step = trainer.global_step
        # Before saving: the ModelCheckpoint state inside this checkpoint must already name it as the last one.
        # Saved with an empty last_model_path (a stop before ModelCheckpoint's first save), the resumed run's
        # ModelCheckpoint would find last.ckpt "taken" and write last-v1.ckpt, leaving last.ckpt at this step.
        self._tell_model_checkpoints(trainer, path, step)
        trainer.save_checkpoint(path)  # collective under DDP (barrier); rank 0 writes
        for mc in trainer.checkpoint_callbacks:
            if hasattr(mc, "note_last_saved") and getattr(mc, "last_model_path", None) == str(path):
                mc.note_last_saved(trainer)  # RunCheckpoint: the cut epoch's end writes no second copy
        self.preempted = name
        self._report(trainer, name, path)
        self._stop(trainer)

    def _report(self, trainer: L.Trainer, name: str, path: Path) -> None:
        step = trainer.global_step
        self.ckpt_path = path
        if trainer.is_global_zero:
            assert self._dir is not None
            write_atomic(self._dir / MARKER, f"signal={name} step={step} checkpoint={path}\n", durable=False)
            log.warning(f"received {name} at step {step}: checkpoint written to {path}; exiting")

    @staticmethod
    def _written_by_a_checkpoint_callback(trainer: L.Trainer, path: Path) -> bool:
        for mc in trainer.checkpoint_callbacks:
            last = getattr(mc, "last_model_path", "") or ""
            if last and Path(last).resolve() == path.resolve() and \
                    getattr(mc, "_last_global_step_saved", None) == trainer.global_step:
                return True
        return False

    @staticmethod
    def _stop(trainer: L.Trainer) -> None:
        trainer.should_stop = True
        # Lightning ignores `should_stop` until min_epochs/min_steps are met (this repo sets min_epochs: 1).
        trainer.fit_loop.min_epochs = 0
        trainer.fit_loop.epoch_loop.min_steps = None

    @staticmethod
    def _tell_model_checkpoints(trainer: L.Trainer, path: Path, step: int) -> None:
        """ModelCheckpoint would save this step once more (at the end of the cut epoch, and ``save_last`` at train
        end), next to our file as ``last-v1.ckpt`` when both are named ``last.ckpt``: tell it the step is saved,
        and that our file is its last checkpoint when it is the file it would write (Lightning internals, guarded;
        without them the only cost is a second checkpoint of the same step)."""
        for mc in trainer.checkpoint_callbacks:
            if hasattr(mc, "_last_global_step_saved"):
                mc._last_global_step_saved = step
            if not getattr(mc, "save_last", False) or not getattr(mc, "dirpath", None):
                continue
            try:
                last = mc.format_checkpoint_name({"epoch": trainer.current_epoch, "step": step},
                                                 mc.CHECKPOINT_NAME_LAST)
            except Exception:  # noqa: BLE001 - a `last` name with other metrics in it: not ours
                continue
            if Path(last).resolve() == path.resolve():
                mc.last_model_path = str(path)
                if hasattr(mc, "_last_checkpoint_saved"):
                    mc._last_checkpoint_saved = str(path)

    def _resolve_dir(self, trainer: L.Trainer) -> Path:
        if self.dirpath is not None:
            return self.dirpath
        mc = trainer.checkpoint_callback
        if mc is not None and getattr(mc, "dirpath", None):
            return Path(mc.dirpath)
        return Path(trainer.default_root_dir) / "checkpoints"

    def _warn_if_slurm_requeue(self, trainer: L.Trainer) -> None:
        from lightning.fabric.plugins.environments import SLURMEnvironment

        env = getattr(trainer.strategy, "cluster_environment", None) or getattr(
            getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
        requeue_signal = getattr(env, "requeue_signal", None)
        if (isinstance(env, SLURMEnvironment) and env.auto_requeue and requeue_signal in self.signals
                and trainer.is_global_zero):
            log.warning(
                f"PreemptionCheckpoint handles {requeue_signal.name} during training instead of Lightning's SLURM "
                f"auto-requeue: requeue from the job script when {self._dir / MARKER} exists, and resume with "
                f"{shell_override('ckpt_path', self._dir / self.filename)}")
