"""A callback that stops a ``train.py`` run at a chosen point with a chosen signal, for the resume property test.

Every run of the test has it in its config (``+callbacks.fault._target_=fault_injection.Fault``, with tests/ on
PYTHONPATH), so a killed run, its resumed parts and the straight run share one config; the point comes from the
environment, as JSON: ``ATTNLAB_FAULT='{"hook": "on_train_batch_end", "step": 7, "signal": "SIGKILL"}'`` (``"times":
2`` sends it twice, as an impatient Ctrl+C does). No variable: the callback does nothing.

hooks: any Lightning callback hook that runs during fit or test (``on_train_batch_end``, ``on_validation_batch_end``,
``on_test_batch_end``, ``on_train_end``, ...), fired the first time it runs at global step ``step`` (any step if
omitted; never during the sanity check), and two checkpoint-write points: ``after_save`` (the file ``file`` has just
been written, renamed into place) and ``during_save`` (``file``'s temporary file is half written, then the signal).
The signal goes to this process (``"group": true``: to its whole process group, as a terminal's Ctrl+C does):
SIGKILL ends it on the spot; SIGTERM and SIGINT reach the run's handlers.

In a sweep, ``"job": n`` fires only in job ``n``. ``"marker": <file>`` fires only if that file does not exist
yet, and makes it: a job that is requeued runs again, its hooks too. The variable may hold a list of points: a
job's process takes the first of its own whose marker is not made yet, so one job can be stopped again and again,
at one point after the other; :class:`SweepFault` (a Hydra callback,
``+hydra.callbacks.fault._target_=fault_injection.SweepFault``) stops the sweep between its jobs: at ``on_job_start``
or ``on_job_end`` of job ``job``, or at ``on_multirun_end`` (before the summary is written).
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from pathlib import Path

import lightning as L
import torch
from hydra.experimental.callback import Callback as HydraCallback

HOOKS = ("on_train_batch_end", "on_validation_batch_end", "on_validation_end", "on_train_epoch_start",
         "on_train_epoch_end", "on_train_end", "on_test_start", "on_test_batch_end", "on_test_end", "on_fit_end")


class Fault(L.Callback):
    def __init__(self) -> None:
        super().__init__()
        spec = _spec(_job_num())
        self.hook = spec.get("hook")
        self.step = spec.get("step")
        self.file = spec.get("file", "last.ckpt")
        self.signum = getattr(signal, spec.get("signal", "SIGKILL"))
        self.times = int(spec.get("times", 1))  # the same signal sent again right away (an impatient Ctrl+C)
        self.job = spec.get("job")
        self.marker = spec.get("marker")
        self.group = bool(spec.get("group"))
        self.fired = False
        for name in HOOKS:
            setattr(self, name, self._hook_fn(name))

    def _hook_fn(self, name):
        def hook(trainer, *args, **kwargs):
            if name == self.hook and self._due(trainer):
                self._fire()
        return hook

    def _due(self, trainer) -> bool:
        return (not self.fired and not trainer.sanity_checking and (self.step is None or trainer.global_step == self.step)
                and (self.job is None or self.job == _job_num()))

    def _fire(self) -> None:
        self.fired = True
        if _first_time(self.marker):
            _send(self.signum, self.times, self.group)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.hook not in ("after_save", "during_save") or not trainer.is_global_zero:
            return
        io_plugin = trainer.strategy.checkpoint_io
        save = io_plugin.save_checkpoint

        def save_checkpoint(checkpoint, path, storage_options=None):
            due = Path(path).name == self.file and self._due(trainer)
            if due and self.hook == "during_save":
                buf = io.BytesIO()
                torch.save(checkpoint, buf)
                data = buf.getvalue()
                tmp = Path(path).with_name(f".{Path(path).name}.{os.getpid()}.tmp")  # AtomicCheckpointIO's name
                tmp.write_bytes(data[: len(data) // 2])
                self._fire()
            save(checkpoint, path, storage_options)
            if due and self.hook == "after_save":
                self._fire()

        io_plugin.save_checkpoint = save_checkpoint


def _job_num() -> int | None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf.errors import MissingMandatoryValue

    try:
        return int(HydraConfig.get().job.num)
    except (ValueError, TypeError, MissingMandatoryValue):  # (a single run has no job number)
        return None


def _spec(job: int | None) -> dict:
    """The point for this job: ATTNLAB_FAULT's object, or the first of ``job``'s in its list not yet fired."""
    spec = json.loads(os.environ.get("ATTNLAB_FAULT") or "{}")
    if isinstance(spec, list):
        return next((s for s in spec if s.get("job") == job and not Path(s.get("marker") or "/nonexistent").exists()),
                    {})
    return spec


def _first_time(marker: str | None) -> bool:
    if marker is None:
        return True
    try:
        Path(marker).touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


def _send(signum: int, times: int = 1, group: bool = False) -> None:
    for _ in range(times):
        if group:
            os.killpg(os.getpgrp(), signum)
        else:
            os.kill(os.getpid(), signum)
    if signum == signal.SIGKILL:
        time.sleep(60)  # not reached


class SweepFault(HydraCallback):
    """The sweep-level stop points (module docstring)."""

    def _at(self, hook: str, job: int | None) -> None:
        spec = _spec(job)
        if spec.get("hook") == hook and spec.get("job") == job and _first_time(spec.get("marker")):
            _send(getattr(signal, spec.get("signal", "SIGKILL")))

    def on_job_start(self, config, **kwargs) -> None:
        self._at("on_job_start", int(config.hydra.job.num))

    def on_job_end(self, config, job_return, **kwargs) -> None:
        self._at("on_job_end", int(config.hydra.job.num))

    def on_multirun_end(self, config, **kwargs) -> None:
        self._at("on_multirun_end", None)
