"""How a training job ends, as the user and a sweep see it: its ``job_status.json``, its ``metrics.json``, its last
lines, the exit status, and a sweep stopped with its summary written.

- a refusal (a bad value, file or checkpoint; a full disk under a writer not ours): one line, exit 2, no folder left
  (the traceback too under ``HYDRA_FULL_ERROR=1``);
- a diverged loss or a checkpoint that could not be written: one line, exit 1, ``last.ckpt`` kept;
- a process of a distributed run gone (its node lost): one line, exit 1, a sweep ends (its next job would wait);
- a stop signal (preemption, Ctrl+C): marked interrupted, exit 0 (a scheduler's requeue) or 130 (Ctrl+C);
- a bug: its traceback, exit 1.
In a sweep each job's outcome is recorded in its ``job_status.json`` and the sweep goes on (a stop signal ends it,
except in a job submitit runs: that job is requeued on submitit's preemption signal, or just ends, and the sweep's
other jobs go on: :mod:`attnlab.runs.submitit_jobs`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from . import ddp, folder as run_folder, submitit_jobs
from ..files.atomic import disk_full, write_atomic
from ..core.errors import CheckpointWriteError, JobStopped, NonFiniteLossError, find_user_error, one_line_message
from ..core.quoting import shell_override
from .build import rank_zero
from .plan import task_overrides
from .summary import summary_lines
from .sweep import one_line, write_job_status, write_summary

log = logging.getLogger("attnlab.cli.train")  # the lines a user reads come from train.py's logger


def job_failed(e: Exception, hc) -> float:
    """The job raised ``e``: in a sweep, record it and go on (the job's value is NaN); in a single run, one line and
    exit 2 for a bad input, exit 1 for a diverged or unsaved run, the traceback for a bug."""
    job_dir = Path(hc.runtime.output_dir)
    in_sweep = hc.mode == RunMode.MULTIRUN
    if in_sweep and _pruned(e) is not None:  # an Optuna trial stopped by its study's pruner: an outcome, not an error
        log.info(f"trial {hc.job.num}: {_pruned(e)}")
        write_job_status(job_dir, hc.overrides.task, pruned=_pruned(e))
        return float("nan")
    if isinstance(e, (NonFiniteLossError, CheckpointWriteError)):  # diverged / disk full: last.ckpt is kept
        log.error(str(e))
        if in_sweep:
            write_job_status(job_dir, hc.overrides.task, error=e)
            return float("nan")
        sys.exit(1)
    # a bad input (config, data, checkpoint), or a full disk under a writer not ours (Lightning's CSV logger, W&B's
    # files): one line, no traceback
    user_error = find_user_error(e) or disk_full(e, getattr(e, "filename", None) or job_dir, appended=True)
    if user_error is not None:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the traceback asked for; still a refusal: exit 2,
            traceback.print_exception(e)  # no folder left
        log.error(one_line_message(user_error))
        if in_sweep:
            write_job_status(job_dir, hc.overrides.task, error=user_error)
            return float("nan")
        run_folder.discard_if_unused(job_dir)  # a refused run leaves no folder behind (never an earlier run's)
        sys.exit(user_error.exit_code)
    if (line := ddp.peer_lost(e)) is not None:  # the run (and a sweep: its next job would wait) cannot go on
        again = Path(hc.sweep.dir) if in_sweep else job_dir  # (a sweep is continued as a whole)
        resumable = (job_dir / "checkpoints" / "last.ckpt").is_file()
        log.error(line + (f"; {shell_override('resume', again)} continues from last.ckpt" if resumable else ""))
        if in_sweep:
            write_job_status(job_dir, hc.overrides.task, error=e)
        sys.exit(1)
    if not in_sweep:
        raise e
    # One failing job (a diverging lr, a bad option) must not end the sweep: log it, record it, go on.
    log.exception(f"job {hc.job.num} failed: {one_line(e)}", exc_info=e)
    write_job_status(job_dir, hc.overrides.task, error=e)
    return float("nan")


def _pruned(e: BaseException | None) -> BaseException | None:
    """The ``optuna.TrialPruned`` that ended the job (raised in a Lightning hook: maybe wrapped), else None."""
    optuna = sys.modules.get("optuna")
    while e is not None and optuna is not None:
        if isinstance(e, optuna.TrialPruned):
            return e
        e = e.__cause__ or e.__context__
    return None


def job_ended(cfg: DictConfig, hc, value: float | None, late_stop: str | None) -> None:
    """The job finished: its status in a sweep (a sweep stopped by a signal that came after the test ends here),
    the last lines of a single run (where everything is, what to run next)."""
    job_dir = Path(hc.runtime.output_dir)
    in_sweep = hc.mode == RunMode.MULTIRUN
    if in_sweep and rank_zero():
        write_job_status(job_dir, hc.overrides.task, value=value)
    if not in_sweep and rank_zero():
        log.info("\n".join(summary_lines(cfg, job_dir, hc.overrides.task)))
    if in_sweep and late_stop and not submitit_jobs.in_job_process():  # (submitit's: the job is done, nothing stops)
        stop_sweep(cfg, late_stop)


def interrupted(cfg: DictConfig, signame: str, where: str) -> None:
    """A preemption or Ctrl+C stopped the run (its state is in last.ckpt): marked interrupted in job_status.json,
    exit 0 (SIGTERM, SIGUSR1: a scheduler's requeue) or 130 (Ctrl+C, the shell's status for an interrupt). The
    machine is going away: a sweep stops here too; resume= continues this job (and runs its test)."""
    run_dir = Path(cfg.paths.output_dir)
    again = Path(HydraConfig.get().sweep.dir) if in_sweep() else run_dir  # (a sweep is continued as a whole)
    if rank_zero():
        write_job_status(run_dir, task_overrides(), interrupted=signame, again=again)
    if submitit_jobs.requeues(signame):
        log.warning(f"stopped by {signame} {where}; submitit requeues the job, which continues from its last.ckpt")
        submitit_jobs.requeue(signame)  # (rank 0 does not come back)
    else:
        log.warning(f"stopped by {signame} {where}; continue with {shell_override('resume', again)}")
    stop_sweep(cfg, signame)


def stop_sweep(cfg: DictConfig, signame: str) -> None:
    """End the process for a stop signal: 130 for Ctrl+C (the shell's status for an interrupt), 0 for a scheduler's
    SIGTERM/SIGUSR1 (a requeue). In a sweep the later jobs are not started, and the summary says so; in a job that
    submitit runs, the job returns (:class:`JobStopped`) and the sweep's other jobs go on."""
    if submitit_jobs.in_job_process():
        raise JobStopped(signame)
    if in_sweep() and rank_zero():
        write_summary(Path(HydraConfig.get().sweep.dir), cfg.get("optimized_metric"), stopped_by=signame)
    raise SystemExit(130 if signame == "SIGINT" else 0)


def in_sweep() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # a config composed by hand, outside a Hydra run
        return False


def write_metrics(run_dir: Path, metrics: dict[str, float]) -> None:
    """The run's final metrics as ``<run dir>/metrics.json``: what scripts (the claims report, notebooks) read back
    without parsing W&B's binary files. Written through a temporary file so a crash never leaves half of it."""
    write_atomic(run_dir / "metrics.json", json.dumps(metrics, indent=1, sort_keys=True))


