"""``launcher=local`` and ``launcher=slurm``: hydra-submitit-launcher's launchers with what a night-long sweep needs
(:mod:`attnlab.runs.submitit_jobs` says what and why). Mixed into its ``LocalLauncher`` / ``SlurmLauncher`` under
``hydra_plugins.attnlab``, where Hydra looks for plugins."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ..core.quoting import shell_override
from . import submitit_jobs as jobs

log = logging.getLogger(__name__)


class RequeueingLauncher:
    _EXECUTOR: str  # "local" | "slurm" (the launcher mixed with)
    params: dict[str, Any]
    config: Any
    hydra_context: Any

    # ------------------------------------------------------------------ in the sweep's process
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        from hydra.core.singleton import Singleton
        from hydra.core.utils import filter_overrides

        self.check_jobs(job_overrides)  # (the sweepers checked the whole sweep; an Optuna trial's values here)
        import submitit

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **self._executor_options())
        executor.update_parameters(**self._job_parameters())
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        nums = range(initial_job_idx, initial_job_idx + len(job_overrides))
        for num, overrides in zip(nums, job_overrides):
            log.info(f"\t#{num} : {' '.join(filter_overrides(overrides))}")
        state = Singleton.get_state()
        with _sigint_ignored(self._EXECUTOR == "local"):
            submitted = executor.map_array(self, [list(o) for o in job_overrides], ["hydra.sweep.dir"] * len(nums),
                                           list(nums), [f"job_id_for_{n}" for n in nums], [state] * len(nums))
        try:
            results = [self._result(job, num, overrides, sweep_dir)
                       for job, num, overrides in zip(submitted, nums, job_overrides)]
        except KeyboardInterrupt:
            self._stopped_by_ctrl_c(submitted, sweep_dir)
        _remove_unfilled(Path(self.params["submitit_folder"]))
        return results

    def _executor_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"folder": self.params["submitit_folder"]}
        if "max_num_timeout" in self.params:
            options[f"{self._EXECUTOR}_max_num_timeout"] = self.params["max_num_timeout"]
        return options

    def _job_parameters(self) -> dict[str, Any]:
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

        shared = set(OmegaConf.structured(BaseQueueConf).keys())  # the parameters every submitit executor takes
        return {k if k in shared else f"{self._EXECUTOR}_{k}": v for k, v in self.params.items()
                if k not in ("submitit_folder", "max_num_timeout")}

    def check_jobs(self, job_overrides: Sequence[Sequence[str]]) -> None:
        """The sweep's trainer and callbacks, and those of each job whose overrides change them, against the
        launcher's parameters (the same for every job): ConfigError, before anything is submitted."""
        signame = jobs.use_preemption_signal()  # (before submitit is imported: it reads the variable then)

        def check(cfg) -> None:
            trainer = {k: OmegaConf.select(cfg, f"trainer.{k}", default=1) for k in ("devices", "num_nodes")}
            signals = OmegaConf.select(cfg, "callbacks.preemption.signals", default=None)
            jobs.check_job(self._EXECUTOR, self.params, trainer, list(signals or []), signame)

        check(self.config)
        for overrides in job_overrides:
            if any(_touches(str(o)) for o in overrides):
                check(self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides)))

    def _result(self, job: Any, num: int, overrides: Sequence[str], sweep_dir: Path) -> Any:
        from hydra.core.utils import JobReturn, JobStatus
        from submitit.core.utils import FailedJobError, UncompletedJobError

        try:
            return job.results()[0]
        except (UncompletedJobError, FailedJobError) as e:
            value = jobs.lost_job(num, e, getattr(job.paths, "stdout", None), sweep_dir)
            return JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=value,
                             working_dir=str(sweep_dir / str(num)))

    def _stopped_by_ctrl_c(self, submitted: Sequence[Any], sweep_dir: Path) -> None:
        """Ctrl+C reached the jobs too (one process group): each saves its state and stops, as a single run does.
        Wait for them (a second Ctrl+C: not), then the summary, one line, exit 130. SLURM's jobs are not ours to
        stop: they go on."""
        from .sweep import write_summary

        local = self._EXECUTOR == "local"
        if local:
            log.warning("Ctrl+C: the running jobs save their state and stop; waiting for them (Ctrl+C again: "
                        "they stop at once, from their last checkpoint)")
            try:
                for job in submitted:
                    job.wait()
            except KeyboardInterrupt:
                pass
        write_summary(sweep_dir, self.config.get("optimized_metric"), stopped_by="SIGINT")
        log.warning(f"the sweep was stopped by Ctrl+C{'' if local else '; its SLURM jobs go on (scancel stops them)'}"
                    f"; continue it with {shell_override('resume', sweep_dir.absolute())}")
        raise SystemExit(130)

    # ------------------------------------------------------------------ in the job's process
    def __call__(self, *args: Any) -> Any:
        jobs.enter_job()
        return super().__call__(*args)  # type: ignore[misc]

    def checkpoint(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                   singleton_state: Any) -> Any:
        """submitit asks, on its preemption signal, what the requeued job runs: this job, continued."""
        from hydra.core.hydra_config import HydraConfig
        from submitit.helpers import DelayedSubmission

        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        try:  # the job's own folder, once Hydra has made it
            job_dir = Path(HydraConfig.get().runtime.output_dir)
        except ValueError:
            job_dir = sweep_dir / str(job_num)
        overrides = jobs.requeued_overrides(sweep_overrides, sweep_dir, job_dir)
        return DelayedSubmission(self, overrides, job_dir_key, job_num, job_id, singleton_state)


@contextmanager
def _sigint_ignored(ignore: bool) -> Iterator[None]:
    """The local executor's controllers, started now, inherit SIGINT ignored: on Ctrl+C they would otherwise kill
    their job (SIGINT twice, then SIGKILL a second later) before it saved its state. The job itself takes Python's
    Ctrl+C back (:func:`attnlab.runs.submitit_jobs.enter_job`)."""
    if not ignore or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _remove_unfilled(folder: Path) -> None:
    """submitit makes the folder it is given with ``%j`` unfilled too (``.submitit/%j``); its jobs never use it."""
    if "%j" in folder.name and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def _touches(override: str) -> bool:
    key = override.split("=", 1)[0].lstrip("~+")
    return key.split(".", 1)[0] in ("trainer", "callbacks")
