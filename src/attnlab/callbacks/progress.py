"""The run's progress: Rich's bar on a terminal; plain lines through the log when stdout is not one.

Piped, under ``nohup`` or in CI, a progress bar prints nothing useful until the end (Rich draws its last frame
only). There :class:`ProgressLines` writes one line every ``every_s`` seconds through :mod:`logging`, so it lands
on stdout and in the run's ``train.log`` alike::

    epoch 1/8, step 120/2500, train/loss 2.345, 3.21 steps/s, elapsed 0:00:37, left ~0:12:21

and one line per validation with its metrics, one every ``every_s`` seconds through a long validation or test, and
one when training ends. Only rank 0 writes (Lightning disables a progress bar on the others). conf/callbacks/
rich_progress_bar.yaml builds it through :func:`progress_display` (``style``: auto, bar or lines).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar

from ..core.choices import PROGRESS_STYLES

log = logging.getLogger(__name__)


def progress_display(style: str = "auto", every_s: float = 10.0) -> ProgressBar:
    """Rich's bar when stdout is a terminal (``style=auto``) or ``style=bar``; else :class:`ProgressLines`."""
    if style not in PROGRESS_STYLES:  # (train.py's config checks refuse it first, in one line)
        raise ValueError(f"style={style!r}: choose one of {', '.join(PROGRESS_STYLES)}")
    if style == "bar" or (style == "auto" and _is_terminal()):
        return RichProgressBar()
    return ProgressLines(every_s=every_s)


def _is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


def clock(seconds: float) -> str:
    """``0:12:21``; days as hours (``50:00:00``)."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def rate_text(steps: float, seconds: float) -> str:
    """``3.21 steps/s``, or ``2.5 s/step`` below one step a second."""
    if steps <= 0 or seconds <= 0:
        return ""
    per_s = steps / seconds
    return f"{per_s:.3g} steps/s" if per_s >= 1 else f"{1 / per_s:.3g} s/step"


def _number(v: Any) -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f"{x:.4g}"


def loss_key(metrics: dict[str, Any]) -> str | None:
    """The training loss a task logs: ``train/loss`` (every family's), else the first ``train/...loss``."""
    if "train/loss" in metrics:
        return "train/loss"
    return next((k for k in sorted(metrics) if k.startswith("train/") and "loss" in k), None)


class ProgressLines(ProgressBar):
    """Lightning's progress bar as plain log lines (module docstring)."""

    def __init__(self, every_s: float = 10.0):
        super().__init__()
        self.every_s = float(every_s)
        self._enabled = True
        self._start = self._last = 0.0
        self._start_step = self._last_step = 0
        self._eval_last = 0.0
        self._first = True

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def _writing(self) -> bool:
        return self._enabled and self._trainer is not None and self.trainer.is_global_zero

    # --- training -----------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self._last = time.monotonic()
        self._start_step = self._last_step = trainer.global_step
        self._first = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        now = time.monotonic()
        if not self._writing or not (self._first or now - self._last >= self.every_s):
            return
        self._first = False
        log.info(self.train_line(trainer, now))
        self._last, self._last_step = now, trainer.global_step

    def train_line(self, trainer: L.Trainer, now: float) -> str:
        step, total = trainer.global_step, trainer.estimated_stepping_batches
        parts = []
        if trainer.max_epochs not in (None, -1):
            parts.append(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}")
        finite = isinstance(total, (int, float)) and math.isfinite(total) and total > 0
        parts.append(f"step {step}/{int(total)}" if finite else f"step {step}")
        metrics = trainer.callback_metrics
        if key := loss_key(metrics):
            parts.append(f"{key} {_number(metrics[key])}")
        if rate := rate_text(step - self._last_step, now - self._last):
            parts.append(rate)
        elapsed = now - self._start
        parts.append(f"elapsed {clock(elapsed)}")
        done = step - self._start_step
        if finite and done > 0:
            parts.append(f"left ~{clock((total - step) * elapsed / done)}")
        return ", ".join(parts)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._writing:
            now = time.monotonic()
            steps = trainer.global_step - self._start_step
            rate = rate_text(steps, now - self._start)
            log.info(f"training done: step {trainer.global_step} in {clock(now - self._start)}"
                     + (f" ({rate})" if rate else ""))

    # --- validation and test ------------------------------------------------------------------------------------
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._eval_last = time.monotonic()

    on_test_start = on_validation_start

    def _eval_batch(self, stage: str, total: Any, batch_idx: int) -> None:
        now = time.monotonic()
        if self._writing and now - self._eval_last >= self.every_s:
            self._eval_last = now
            of = f"/{int(total)}" if isinstance(total, (int, float)) and math.isfinite(total) else ""
            log.info(f"{stage}: batch {batch_idx + 1}{of}")

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if not trainer.sanity_checking:
            self.has_dataloader_changed(dataloader_idx)
            self._eval_batch("validation", self.total_val_batches_current_dataloader, batch_idx)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self.has_dataloader_changed(dataloader_idx)
        self._eval_batch("test", self.total_test_batches_current_dataloader, batch_idx)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.reset_dataloader_idx_tracker()
        if trainer.sanity_checking or not self._writing:
            return
        shown = trainer.progress_bar_metrics
        metrics = {k: v for k, v in shown.items() if k.startswith("val/")} or {
            k: v for k, v in trainer.callback_metrics.items() if k == "val/loss"}
        where = f"epoch {trainer.current_epoch + 1}" + (
            f"/{trainer.max_epochs}" if trainer.max_epochs not in (None, -1) else "")
        values = ", ".join(f"{k} {_number(v)}" for k, v in sorted(metrics.items()))
        log.info(f"{where} validated (step {trainer.global_step})" + (f": {values}" if values else ""))
        self._last, self._last_step = time.monotonic(), trainer.global_step  # the next rate: training steps only

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.reset_dataloader_idx_tracker()
