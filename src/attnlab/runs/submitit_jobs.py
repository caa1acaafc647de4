"""Sweep jobs that submitit runs (``launcher=local``: each job its own process on this machine; ``launcher=slurm``:
each a SLURM job), requeued when preempted and continued from their ``last.ckpt``.

submitit's own preemption handling (its handler for ``SUBMITIT_PREEMPT_SIGNAL``, SIGUSR2 unless set) calls the
launcher's ``checkpoint()`` from inside the signal handler, in the middle of a step, and requeues the job with the
arguments that returns; Hydra's launcher returns the same overrides, so the job would start again from nothing, in
a folder that is no longer empty (refused: one run per folder). Here:

- the preemption signal is SIGUSR1 (unless the user set ``SUBMITIT_PREEMPT_SIGNAL``), which
  :class:`~attnlab.callbacks.preemption.PreemptionCheckpoint` handles: a full checkpoint at the next finished step
  (in the test: a stop after the batch; between them: at the stage's end). Only once the run has ended as
  interrupted is submitit's handler called (:func:`requeue`); it calls ``checkpoint()``, which requeues the job with
  ``resume=<job dir>``, or, for a job stopped before its first checkpoint, moves its folder aside and runs it anew
  (as ``resume=<sweep dir>`` does). A signal before training started reaches submitit's handler directly.
- A job stopped by another signal ends as interrupted without ending the sweep (:func:`in_job_process`): the other
  jobs are other processes and go on; the summary says which job stopped; ``resume=<sweep dir>`` continues it.
- A job whose process ended without a result (SIGKILL, out of memory, the time limit) is one line, and the sweep
  goes on; ``resume=<sweep dir>`` continues that job too.
- Before anything is submitted, ``hydra.launcher``'s ``tasks_per_node`` and ``nodes`` are checked against
  ``trainer.devices`` and ``trainer.num_nodes`` (:func:`check_job`): Lightning checks them only once the job runs.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.quoting import shell_override

log = logging.getLogger(__name__)

SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"  # submitit's variable: the signal name without SIG, read when it is imported
DEFAULT_SIGNAL = "USR1"  # what PreemptionCheckpoint handles and SLURM's --signal sends in this repo's recipes

# set in a job process that submitit started, by the launcher, before the job runs
_requeue_handler: Callable[[int, Any], None] | None = None
_requeue_signum: int | None = None


# ----------------------------------------------------------------------------------------------------------------
# in the job's process
# ----------------------------------------------------------------------------------------------------------------
def enter_job() -> None:
    """Called first in the job's process: keep submitit's handler for its preemption signal, for :func:`requeue`;
    take Python's Ctrl+C back (the local executor's controller was started with it ignored: ``launch``)."""
    global _requeue_handler, _requeue_signum
    from submitit.core.job_environment import JobEnvironment

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _requeue_signum = JobEnvironment._usr_sig()
    handler = signal.getsignal(_requeue_signum)
    _requeue_handler = handler if callable(handler) else None


def in_job_process() -> bool:
    """This process is one job of a sweep that submitit runs: its stop ends the job, not the sweep."""
    return _requeue_signum is not None


def requeues(signame: str) -> bool:
    return _requeue_handler is not None and signal.Signals[signame] == _requeue_signum


def requeue(signame: str) -> None:
    """The job was stopped by submitit's preemption signal and its state is saved: let submitit requeue it (rank 0
    exits here: SLURM's ``scontrol requeue``, the local executor's exit status 144). Other signals: nothing."""
    if requeues(signame):
        assert _requeue_handler is not None and _requeue_signum is not None
        _requeue_handler(_requeue_signum, None)


def requeued_overrides(overrides: Sequence[str], sweep_dir: Path, job_dir: Path) -> list[str]:
    """The overrides the requeued job runs with: ``resume=<job dir>`` once it has a checkpoint; before one, its
    folder moved aside and the job run anew."""
    from . import sweep_continue as cont
    from .resume import has_checkpoint

    num = int(job_dir.name) if job_dir.name.isdigit() else -1
    own = cont.without_own_keys(overrides)  # (a job requeued before ran with resume= already)
    if has_checkpoint(job_dir):
        return cont.launch_overrides(cont.Job(num, tuple(own), "resume"), sweep_dir)
    if job_dir.is_dir() and any(job_dir.iterdir()):
        cont.move_aside(job_dir)
    return cont.launch_overrides(cont.Job(num, tuple(own), "restart"), sweep_dir)


# ----------------------------------------------------------------------------------------------------------------
# in the sweep's process, before and after submission
# ----------------------------------------------------------------------------------------------------------------
def use_preemption_signal() -> str:
    """SIGUSR1 as submitit's preemption signal, unless the user chose one (its jobs inherit the variable)."""
    name = os.environ.setdefault(SIGNAL_ENV, DEFAULT_SIGNAL).upper().removeprefix("SIG")
    if "submitit" in sys.modules:  # imported before the variable was set: it read the default
        from submitit.core.job_environment import JobEnvironment

        JobEnvironment.USR_SIG = name
    return name


def check_job(executor: str, launcher: dict, trainer: dict, handled: Sequence[str], signame: str) -> None:
    """One line before submission when the job's processes would not be the run's: ``launcher=local`` starts
    ``tasks_per_node`` copies of the job with nothing that makes them DDP ranks; SLURM's tasks are Lightning's
    ranks only when ``tasks_per_node`` = ``trainer.devices`` and ``nodes`` = ``trainer.num_nodes``."""
    tasks, nodes = launcher.get("tasks_per_node", 1), launcher.get("nodes", 1)
    if executor == "local":
        if tasks != 1 or nodes != 1:
            raise ConfigError(f"launcher=local runs each job as one process on this machine: "
                              f"hydra.launcher.tasks_per_node={tasks} nodes={nodes} would start {tasks * nodes} "
                              f"copies of it writing one folder; set both to 1 (Lightning starts trainer.devices "
                              f"processes itself)")
    else:
        devices = _devices(trainer.get("devices", 1), launcher.get("gpus_per_node"))
        if devices is not None and tasks != devices:
            raise ConfigError(f"hydra.launcher.tasks_per_node={tasks} but trainer.devices={trainer.get('devices')}"
                              f" ({devices} per node): on SLURM each task is one of Lightning's processes; make "
                              f"them equal")
        num_nodes = trainer.get("num_nodes", 1)
        if nodes != num_nodes:
            raise ConfigError(f"hydra.launcher.nodes={nodes} but trainer.num_nodes={num_nodes}: make them equal")
    names = [str(s).upper().removeprefix("SIG") for s in handled]
    if signame not in names:
        raise ConfigError(f"{SIGNAL_ENV}={signame}: submitit requeues a job on SIG{signame}, but "
                          f"callbacks.preemption does not handle it (its signals: {names or 'none'}): the requeued "
                          f"job would lose what it trained since its last checkpoint; use USR1 or add SIG{signame}")


def _devices(devices: Any, gpus_per_node: int | None) -> int | None:
    """Processes per node Lightning starts for ``trainer.devices`` (None: not known before the job runs)."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and devices.isdigit():
        devices = int(devices)
    if isinstance(devices, int) and devices > 0:
        return devices
    return gpus_per_node or None  # "auto" / -1: every GPU the job is given


def lost_job(num: int, error: BaseException, log_file: Path | None, sweep_dir: Path) -> float:
    """A job whose process gave no result (killed, out of memory, over its time): one line, the sweep goes on."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    where = f"; its output: {log_file}" if log_file is not None else ""
    log.error(f"job {num} ended without a result ({reason}){where}; {shell_override('resume', sweep_dir)} "
              f"continues it")
    return math.nan
