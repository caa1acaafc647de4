"""A summary at the end of every Hydra sweep: which jobs finished, their metric, which failed and why.

In a sweep, train.py catches a job's exception, logs it with its traceback in the job's log, records it, and
moves on; this callback adds what a researcher needs the next morning: every job's status in one table, printed and saved as
``<sweep dir>/sweep_summary.md``. Each job writes ``job_status.json`` into its own directory (so it works with
any launcher, SLURM included); the summary is assembled from those files when the sweep ends.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from ..files.atomic import write_atomic
from ..core.errors import DiskFullError
from ..core.quoting import shell_override

log = logging.getLogger(__name__)
STATUS_FILE = "job_status.json"


# Overrides that say how or where a job runs, not what it trains: jobs differing only in these (and in `seed`) are
# seeds of one setting. `seed` itself is what a seed sweep varies.
SEED_KEY = "seed"
BOOKKEEPING = ("hydra", "paths", "logger", "resume", "existing_run", "ckpt_path", "tags", "launcher", "local",
               "task_name", "optimized_metric", "callbacks.rich_progress_bar", "trainer.enable_progress_bar",
               "threads", "extend_sweep", "trial")
# a continued sweep's own overrides (runs/sweep_continue.py): how the job was run, not what it is
CONTINUATION_KEYS = ("resume", "extend_sweep")
WANDB_GROUP_MAX = 128  # W&B refuses longer group names
WANDB_TAG_MAX = 64  # ... and longer tags


def override_key(item: str) -> str:
    """``"++model.net.d_model=64"`` -> ``"model.net.d_model"``; ``"hydra/launcher=slurm"`` -> ``"hydra/launcher"``."""
    return item.split("=", 1)[0].lstrip("+~")


def _is_bookkeeping(key: str, seed: bool = True) -> bool:
    return (seed and key == SEED_KEY) or any(key == b or key.startswith((b + ".", b + "/")) for b in BOOKKEEPING)


def job_setting(overrides: Iterable[str]) -> tuple[str, ...]:
    """What one job trains, seed included: its overrides without run bookkeeping, ``+`` dropped, sorted. Two jobs of
    one sweep folder with the same setting are the same job (:mod:`attnlab.runs.sweep_continue`)."""
    items = {override_key(o): o.lstrip("+") for o in overrides}
    return tuple(items[k] for k in sorted(items) if not _is_bookkeeping(k, seed=False))


def setting_overrides(overrides: Iterable[str], as_typed: bool = False) -> list[str]:
    """The overrides that define what a job trains, without its seed and run bookkeeping, sorted so that the
    order typed on the command line does not matter: ``["norm=rms", "seed=1", "logger=csv"]`` -> ``["norm=rms"]``.
    A key added with ``+`` is named without it, unless ``as_typed`` (a command line to run again needs it)."""
    items = {override_key(o): o if as_typed else o.lstrip("+") for o in overrides}
    return [items[k] for k in sorted(items) if not _is_bookkeeping(k)]


def setting_name(overrides: Iterable[str], prefix: str = "", drop: Iterable[str] = ()) -> str:
    """A stable name for the setting of a job (its overrides minus seed and bookkeeping, minus the keys in ``drop``):
    ``prefix/key=value,key=value``, or ``prefix`` alone. Jobs that differ only by seed get the same name. Longer
    than W&B's 128 characters, it ends with a hash of the full name (still stable)."""
    drop = set(drop)
    items = [o for o in setting_overrides(overrides) if override_key(o) not in drop]
    name = "/".join(p for p in (prefix, ",".join(items)) if p)
    if len(name) > WANDB_GROUP_MAX:
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = f"{name[:WANDB_GROUP_MAX - 9]}~{digest}"
    return name


def one_line(error: BaseException) -> str:
    """The root cause as ``Type: message`` on one line (Hydra wraps errors of instantiated targets)."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = f"{type(error).__name__}: {error}".strip().replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


def write_job_status(job_dir: str | Path, overrides, *, value: Any = None, error: BaseException | None = None,
                     interrupted: str | None = None, pruned: BaseException | None = None,
                     again: str | Path | None = None) -> None:
    """Record how this job ended, in its own directory (read back by :class:`SweepSummary`). ``interrupted``: the
    signal that stopped it (preemption, Ctrl+C); ``resume=<again>`` (the sweep's folder in a sweep, else the
    run's: ``job_dir``) continues it and rewrites this file. ``pruned``: the
    Optuna pruner's stop (its epochs trained and of how many). Only rank 0 writes (another node's process of the
    same job: nothing)."""
    from .ddp import launching_process

    if not launching_process():
        return
    if pruned is not None:
        status = {"status": "pruned", "error": str(pruned), "epochs": getattr(pruned, "epochs", None),
                  "max_epochs": getattr(pruned, "max_epochs", None)}
    elif interrupted is not None:
        status = {"status": "interrupted", "error": f"stopped by {interrupted}; continue with "
                                                    f"{shell_override('resume', again or job_dir)}"}
    elif error is not None:
        status = {"status": "failed", "error": one_line(error)}
    elif isinstance(value, float) and math.isfinite(value):
        status = {"status": "completed", "value": value}
    elif isinstance(value, list) and value and all(isinstance(v, float) and math.isfinite(v) for v in value):
        status = {"status": "completed", "value": value}  # a multi-objective search's metrics
    else:
        status = {"status": "completed, no finite metric", "value": value}
    status.update(job=Path(job_dir).name, overrides=list(overrides or []))
    write_atomic(Path(job_dir, STATUS_FILE), json.dumps(status, default=str))
    _written_here.add(Path(job_dir).resolve())


_written_here: set[Path] = set()  # job folders whose status this process wrote (a resumed run writes it again)


class SweepSummary(Callback):
    """Hydra callback (conf/hydra/default.yaml). ``fail_exit_code``: exit status of a sweep with failed jobs."""

    def __init__(self, fail_exit_code: int = 1):
        self.fail_exit_code = fail_exit_code

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        from .ddp import launching_process

        job_dir = Path(config.hydra.runtime.output_dir)
        if not launching_process() or job_dir.resolve() in _written_here:
            return  # DDP ranks > 0 (Lightning's, or other nodes') run the same job in its folder; train.py wrote it
        try:
            if job_return.status == JobStatus.COMPLETED:
                write_job_status(job_dir, job_return.overrides, value=job_return._return_value)
            else:
                write_job_status(job_dir, job_return.overrides, error=job_return._return_value)
        except DiskFullError as e:  # Hydra's callback wrapper would turn it into a warning and exit 0
            log.error(str(e))
            sys.exit(e.exit_code)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from .ddp import launching_process

        if not launching_process():
            return  # another node running the same sweep: rank 0's node writes its summary
        failed = write_summary(Path(config.hydra.sweep.dir), config.get("optimized_metric"))
        if failed and self.fail_exit_code:
            sys.exit(self.fail_exit_code)


def write_summary(sweep_dir: Path, metric: str | None, stopped_by: str | None = None) -> int:
    """Print and save ``<sweep dir>/sweep_summary.md`` from the jobs' ``job_status.json``; returns how many failed.
    ``stopped_by``: the signal that stopped the sweep before its end (the jobs not listed were not started)."""
    # the numbered job folders only: a job run anew was moved aside to <n>.old-<time> with its status
    files = sorted((p for p in sweep_dir.glob(f"*/{STATUS_FILE}") if p.parent.name.isdigit()),
                   key=lambda p: int(p.parent.name))
    rows = [json.loads(f.read_text()) for f in files]
    if not rows:
        return 0
    if isinstance(metric, (list, tuple)) or OmegaConf.is_list(metric):  # a multi-objective search
        metric = ", ".join(str(m) for m in metric)
    lines = [f"| job | overrides | status | {metric or 'metric'} / error |", "|---|---|---|---|"]
    for r in rows:
        value = r.get("value")
        detail = r.get("error") or (f"{value:.4f}" if isinstance(value, float) else
                                    ", ".join(f"{v:.4f}" for v in value) if isinstance(value, list) else value)
        overrides = [o for o in r["overrides"] if override_key(o).split(".")[0] not in (*CONTINUATION_KEYS, "trial")]
        lines.append(f"| {r['job']} | {' '.join(overrides)} | {r['status']} | {detail} |")
    count = {status: sum(r["status"].startswith(status) for r in rows)
             for status in ("completed", "interrupted", "failed", "pruned")}
    if stopped_by:
        head = (f"Sweep stopped by {stopped_by} after {len(rows)} job(s): {count['completed']} completed, "
                f"{count['interrupted']} interrupted (resume= continues each), {count['failed']} failed; the jobs "
                f"after job {rows[-1]['job']} were not started")
    else:
        pruned = f", {count['pruned']} pruned" if count["pruned"] else ""
        head = (f"Sweep finished: {len(rows) - count['failed'] - count['pruned']} of {len(rows)} jobs completed"
                f"{pruned}, {count['failed']} failed")
    text = head + "\n\n" + "\n".join(lines) + "\n"
    study = sweep_dir / "optuna_study.md"  # an Optuna search's trials, best or Pareto front, what pruning saved
    if study.is_file():
        text += "\n" + study.read_text(encoding="utf-8")
    write_atomic(sweep_dir / "sweep_summary.md", text, durable=False)
    log.info(f"{text}(saved to {sweep_dir / 'sweep_summary.md'})")
    for r in rows:
        if r["status"] == "failed":
            log.error(f"job {r['job']} ({' '.join(r['overrides'])}) failed: {r['error']}")
    return count["failed"]
