"""Training entry point: ``python train.py [group=option ...] [key=value ...]`` (or ``attnlab-train``).

Each Hydra job (a single run or one job of ``-m``) is one run folder and one W&B run: its config is planned once
(:func:`attnlab.runs.plan.preflight`: every check, one line for a bad value, file or checkpoint, before Lightning is
imported), then :func:`run` builds data, model, callbacks, loggers and trainer from the plan, fits, tests with the
best checkpoint, and the job returns ``optimized_metric`` for sweepers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig

from ..runs import ddp, folder as run_folder
from ..files.log_file import raise_if_failed
from ..core.errors import JobStopped
from ..core.paths import CONF_DIR
from ..runs.build import build_run, finish_loggers, rank_zero
from ..runs.outcome import interrupted, job_ended, job_failed, write_metrics
from ..runs.plan import RunPlan, plan, preflight, print_plan
from ..runs import threads

if TYPE_CHECKING:
    import lightning as L

    from ..callbacks.stage_signals import StageSignals

log = logging.getLogger(__name__)


def run(the_plan: RunPlan | DictConfig, stops: StageSignals | None = None) -> dict[str, float]:
    """Fit and test as the plan says; return the final metrics (floats). A config composed in Python (the tests,
    the notebooks) is planned here (:func:`attnlab.runs.plan.plan`). ``stops``: the stop signals between the
    stages (installed by the caller around this call)."""
    from ..callbacks.stage_signals import StageSignals

    if not isinstance(the_plan, RunPlan):
        the_plan = plan(the_plan)
    stops = stops if stops is not None else StageSignals()
    built = build_run(the_plan, stops)
    metrics: dict[str, float] = {}
    with ddp.distributed_job():
        try:
            _fit_and_test(the_plan, built.trainer, built.model, built.datamodule, metrics, stops)
        finally:
            finish_loggers(built.loggers)
    return metrics


def _fit_and_test(the_plan: RunPlan, trainer: L.Trainer, model, datamodule, metrics: dict,
                  stops: StageSignals) -> None:
    from ..checkpoints.read import verified  # weights_only=True, refusals are one line

    cfg, checkpoint = the_plan.cfg, the_plan.checkpoint
    # the trusted file (a name such as "last", or a URL, is Lightning's to find)
    ckpt_path = str(checkpoint.path) if checkpoint is not None else cfg.get("ckpt_path")
    if checkpoint is not None and checkpoint.exported:
        ckpt_path = None  # an exported model's weights are the model's already (runs.build.build_run)
    if cfg.get("train"):
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        from ..callbacks.exact_resume import restored_metrics

        # a part resumed after (or near) the end of training logged little or nothing itself
        metrics.update(restored_metrics(trainer))
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
        from ..callbacks.preemption import preemption_signal

        if signame := preemption_signal(trainer):
            interrupted(cfg, signame, "in training: not testing")
        stops.between = True  # (also when nothing was left to train: fit then runs no training stage)
    if stops.received:
        interrupted(cfg, stops.received, "after training, before the test: not tested")
    if cfg.get("test"):
        from ..callbacks.preemption import TestInterrupted

        # After training: the best checkpoint (the last weights if none was kept). Test only: ckpt_path.
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") if cfg.get("train") else ""
        ckpt = verified(best) if best else (None if cfg.get("train") else ckpt_path)  # (one this run wrote)
        try:
            trainer.test(model, datamodule=datamodule, ckpt_path=ckpt, weights_only=True)
        except TestInterrupted as e:
            interrupted(cfg, e.signame, "in the test: no metrics.json")
        stops.between = True
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})


_job_started = False  # set when Hydra calls the job: a Hydra error before that is a bad command line
_late_stop: str | None = None  # a stop signal received after a job's test (its results were written)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def _main(cfg: DictConfig) -> float | None:
    global _job_started
    _job_started = True
    hc = HydraConfig.get()
    try:
        value = train_job(cfg, hc)
    except JobStopped:  # one job of a sweep that submitit runs: its status says "interrupted", the other jobs go on
        return float("nan")
    except Exception as e:  # a refusal or a stop is one line (exit 2 / 1); a bug keeps its traceback
        return job_failed(e, hc)
    job_ended(cfg, hc, value, _late_stop)
    return value


def train_job(cfg: DictConfig, hc) -> float | list[float] | None:
    run_dir = Path(hc.runtime.output_dir)
    # (the overrides as Hydra holds them: turned into a list they would resolve ${oc.env:...} before its check)
    the_plan = preflight(cfg, hc.overrides.task, run_dir)
    ddp.meet_the_other_ranks(str(hc.job.num) if hc.mode == RunMode.MULTIRUN else "run")  # torchrun: bounded wait
    # after every refusal (torch is imported here), before any thread starts; per DDP rank
    chosen = threads.apply(the_plan.resolved.get("threads", "auto"), threads.ranks_of(the_plan.resolved["trainer"]),
                           previous=threads_so_far(the_plan))
    if run_folder.launching_process():
        print_plan(the_plan, chosen.line())
    from ..callbacks.stage_signals import StageSignals

    stops = StageSignals()
    with stops.installed():  # until the results are written: a stop after the test waits for them
        metrics = run(the_plan, stops)
        if rank_zero():
            write_metrics(run_dir, metrics)
    global _late_stop
    if stops.received:
        log.warning(f"received {stops.received} after the test: the run had finished, its results are written")
        _late_stop = stops.received  # a sweep writes this job's status, then stops
    raise_if_failed()  # the run is done and its results written; its log is not complete
    name = cfg.get("optimized_metric")
    names = [str(n) for n in name] if isinstance(name, (list, ListConfig)) else [name] if name else []
    if names and all(n in metrics for n in names):
        log.info(", ".join(f"{n} = {metrics[n]:.4f}" for n in names))
        return metrics[names[0]] if isinstance(name, str) else [metrics[n] for n in names]
    return None


def threads_so_far(the_plan: RunPlan) -> int | None:
    """resume=: the threads the run trained with so far (its checkpoint records them); None for a new run."""
    from ..checkpoints.loop_position import THREADS_KEY

    if not the_plan.resuming or the_plan.checkpoint is None:
        return None
    return the_plan.checkpoint.contents.get(THREADS_KEY)


def main() -> None:
    from ..runs.sweeper_plugins import register

    from .hydra_errors import one_line_hydra_errors

    register()  # the sweepers (an editable install hides them from Hydra's own scan)
    one_line_hydra_errors(_main, lambda: _job_started)


if __name__ == "__main__":
    main()
