"""A summary at the end of every Hydra sweep: which jobs finished, their metric, which failed and why.

In a sweep, train.py catches a job's exception, logs it with its traceback in the job's log, records it, and
moves on; this callback adds what a researcher needs the next morning: every job's status in one table, printed and saved as
``<sweep dir>/sweep_summary.md``. Each job writes ``job_status.json`` into its own directory (so it works with
any launcher, SLURM included); the summary is assembled from those files when the sweep ends.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)
STATUS_FILE = "job_status.json"


def one_line(error: BaseException) -> str:
    """The root cause as ``Type: message`` on one line (Hydra wraps errors of instantiated targets)."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = f"{type(error).__name__}: {error}".strip().replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


def write_job_status(job_dir: str | Path, overrides, *, value: Any = None, error: BaseException | None = None) -> None:
    """Record how this job ended, in its own directory (read back by :class:`SweepSummary`)."""
    if error is not None:
        status = {"status": "failed", "error": one_line(error)}
    elif isinstance(value, float) and math.isfinite(value):
        status = {"status": "completed", "value": value}
    else:
        status = {"status": "completed, no finite metric", "value": value}
    status.update(job=Path(job_dir).name, overrides=list(overrides or []))
    Path(job_dir, STATUS_FILE).write_text(json.dumps(status, default=str))


class SweepSummary(Callback):
    """Hydra callback (conf/hydra/default.yaml). ``fail_exit_code``: exit status of a sweep with failed jobs."""

    def __init__(self, fail_exit_code: int = 1):
        self.fail_exit_code = fail_exit_code

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        job_dir = Path(config.hydra.runtime.output_dir)
        if os.environ.get("LOCAL_RANK", "0") != "0" or (job_dir / STATUS_FILE).exists():
            return  # DDP ranks > 0 re-run the same job in the same directory; train.py already wrote it
        if job_return.status == JobStatus.COMPLETED:
            write_job_status(job_dir, job_return.overrides, value=job_return._return_value)
        else:
            write_job_status(job_dir, job_return.overrides, error=job_return._return_value)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        files = sorted(sweep_dir.glob(f"*/{STATUS_FILE}"), key=lambda p: (len(p.parent.name), p.parent.name))
        rows = [json.loads(f.read_text()) for f in files]
        if not rows:
            return
        metric = config.get("optimized_metric") or "metric"
        lines = [f"| job | overrides | status | {metric} / error |", "|---|---|---|---|"]
        for r in rows:
            value = r.get("value")
            detail = r.get("error") or (f"{value:.4f}" if isinstance(value, float) else value)
            lines.append(f"| {r['job']} | {' '.join(r['overrides'])} | {r['status']} | {detail} |")
        failed = [r for r in rows if r["status"] == "failed"]
        head = f"Sweep finished: {len(rows) - len(failed)} of {len(rows)} jobs completed, {len(failed)} failed"
        text = head + "\n\n" + "\n".join(lines) + "\n"
        (sweep_dir / "sweep_summary.md").write_text(text)
        log.info(f"{text}(saved to {sweep_dir / 'sweep_summary.md'})")
        for r in failed:
            log.error(f"job {r['job']} ({' '.join(r['overrides'])}) failed: {r['error']}")
        if failed and self.fail_exit_code:
            sys.exit(self.fail_exit_code)
