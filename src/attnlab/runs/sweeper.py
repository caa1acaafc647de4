"""``train.py -m``'s sweeper (conf/hydra/sweeper/continuable.yaml): Hydra's basic sweeper — every combination of the
swept values, in the same order and numbering — that can also continue a sweep folder (``resume=<sweep dir>``,
:mod:`attnlab.runs.sweep_continue`). It runs the jobs through whichever launcher is configured (in this process,
joblib, submitit), in batches of consecutive job numbers."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from ..core.errors import UserError
from . import sweep_continue as cont
from .folder import other_rank_job_overrides

log = logging.getLogger(__name__)


class ContinuableSweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        (all_jobs,) = self.split_arguments(parser.parse_overrides([*self._parse_config(), *arguments]), None)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        resume = self.config.get("resume")
        try:
            recorded = {} if cont.not_resuming(resume) else cont.recorded_jobs(sweep_dir)
            jobs = cont.plan_jobs(sweep_dir, all_jobs, resume, bool(self.config.get("extend_sweep")))
            if (check := getattr(self.launcher, "check_jobs", None)) is not None:  # launcher=local/slurm: before
                check([j.overrides for j in jobs if j.action != "finished"])  # the sweep's folder is written
        except UserError as e:
            from .folder import _refuse, discard_if_unused

            discard_if_unused(Path(str(self.config.hydra.sweep.dir)))  # a refused sweep leaves no folder
            _refuse(e)
        continuing = not cont.not_resuming(resume)
        # every node runs the sweep (torchrun ... train.py -m): rank 0's node writes it, the others follow its plan
        # (read from the same folder: they move nothing aside, and a job rank 0 runs anew is one they run anew)
        other_rank = other_rank_job_overrides()
        if not other_rank:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(self.config, sweep_dir / cont.MULTIRUN_FILE)
            cont.write_plan(sweep_dir, jobs, recorded)
            if continuing:
                _say_plan(jobs, sweep_dir)
            for job in jobs:
                if job.action == "restart":
                    cont.move_aside(sweep_dir / str(job.num))
        todo = [j for j in jobs if j.action != "finished"]
        returns = []
        for batch in _batches(todo, self.max_batch_size):
            overrides = [[*(cont.launch_overrides(j, sweep_dir) if continuing else j.overrides), *other_rank]
                         for j in batch]
            self.validate_batch_is_legal(overrides)
            results = self.launcher.launch(overrides, initial_job_idx=batch[0].num)
            for r in results:
                _ = r.return_value  # (Hydra's way to raise a job's exception here)
            returns.append(results)
        return returns


def _batches(jobs: Sequence[cont.Job], size: int | None) -> Iterator[list[cont.Job]]:
    """Runs of consecutive job numbers (a launcher numbers a batch from its first), at most ``size`` each."""
    batch: list[cont.Job] = []
    for job in jobs:
        if batch and (job.num != batch[-1].num + 1 or (size and len(batch) >= size)):
            yield batch
            batch = []
        batch.append(job)
    if batch:
        yield batch


def _say_plan(jobs: Sequence[cont.Job], sweep_dir: Path) -> None:
    def nums(action: str) -> str:
        found = [str(j.num) for j in jobs if j.action == action]
        return ", ".join(found) if found else "none"

    log.info(f"continuing the sweep {sweep_dir}: finished (kept as they are): {nums('finished')}; continued from "
             f"their last.ckpt: {nums('resume')}; run anew: {nums('restart')}; not started before: {nums('new')}")
