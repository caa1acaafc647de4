"""What a training run is built from, once its plan is made (:mod:`attnlab.runs.plan`): the data, the task, the
callbacks and loggers the config names, the checkpoint callback every run keeps, and the trainer
(:func:`build_run`). Nothing here checks a value: the plan did.

Lightning is imported inside the functions, so that planning (and a refused command line) never pays for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    import lightning as L

    from ..callbacks.stage_signals import StageSignals

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltRun:
    datamodule: L.LightningDataModule
    model: L.LightningModule
    trainer: L.Trainer
    loggers: list


def build_run(the_plan: Any, stops: StageSignals) -> BuiltRun:
    """Data, task, loggers, callbacks (``stops`` among them) and trainer from the plan alone (a
    :class:`~attnlab.runs.plan.RunPlan`, which imports this module), in the order that keeps
    a refusal cheap and a resumed run exact: the task is checked against the continued checkpoint and the data read
    before any logger, callback or trainer exists."""
    import lightning as L

    from ..callbacks.run_log import RunLogCheck
    from ..files.log_file import watch_file_handlers
    from . import ddp, resume
    from .config_tree import flatten
    from .console import tidy_lightning_output, without_wandb_notices

    cfg, checkpoint = the_plan.cfg, the_plan.checkpoint
    tidy_lightning_output()
    ddp.install()  # before the Trainer exists: DDP ranks re-run this job's saved config (see ddp.py)
    L.seed_everything(cfg.seed, workers=True)
    datamodule: L.LightningDataModule = hydra.utils.instantiate(cfg.data)
    model = hydra.utils.instantiate(the_plan.model, _convert_="all")
    if checkpoint is not None:
        checkpoint.check_fits(model)  # of other sizes or parts: one line, no logger yet
    if rank_zero():
        # the data read (and the cache built) before any logger, checkpoint or trainer exists: a bad file is one line
        # and the refused run leaves no folder; every data module's setup is idempotent (Lightning's own call then
        # returns at once), and nothing between here and it draws from the random generators
        datamodule.prepare_data()
        datamodule.setup("fit")
        if checkpoint is not None:
            resume.check_tokenizer(checkpoint, datamodule, the_plan.option)
    if checkpoint is None and cfg.get("init_from"):  # a new run from a model folder's weights (a resumed one: its own)
        from .init_from import load_weights

        load_weights(model, cfg.init_from)
    if checkpoint is not None and checkpoint.exported:  # (train=false) its weights are tested: Lightning reads no folder
        model.restore(checkpoint.contents, checkpoint.path)
    if checkpoint is not None:
        checkpoint.drop_tensors()  # checked; Lightning restores them from the file itself
    loggers = instantiate_all(cfg.get("logger"))
    callbacks = drop_callbacks_needing_a_logger(instantiate_all(cfg.get("callbacks")), loggers)
    callbacks = with_run_checkpointing(cfg, callbacks)
    callbacks.append(RunLogCheck())  # a full disk under a log file (train.log, W&B's) stops the run at the next batch
    trial = cfg.get("trial") or {}
    metric = cfg.get("optimized_metric")
    if trial.get("id") is not None and isinstance(metric, str):
        # a trial of an Optuna search of one objective: report to it each validation, maybe pruned (Optuna keeps
        # no intermediate values of several objectives)
        from ..callbacks.optuna_pruning import OptunaPruning

        callbacks.append(OptunaPruning(trial.study, trial.storage, trial.id, metric, pruner=_search_pruner()))
    callbacks.append(stops)
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)

    without_wandb_notices(loggers)
    for lg in loggers:
        lg.experiment  # noqa: B018 - starts W&B's run (wandb.init adds its debug.log handler)
    watch_file_handlers()  # a full disk under W&B's folder: one line at the next batch, not a traceback per record
    for lg in loggers:
        lg.log_hyperparams(flatten(the_plan.resolved))
    return BuiltRun(datamodule, model, trainer, loggers)


def _search_pruner() -> dict | None:
    """The Optuna search's pruner config (``hydra.sweeper.pruner``), which the trial's job applies itself."""
    from hydra.core.hydra_config import HydraConfig

    try:
        node = OmegaConf.select(HydraConfig.get(), "sweeper.pruner", default=None)
    except ValueError:  # not a Hydra job
        return None
    return OmegaConf.to_container(node, resolve=True) if node is not None else None


def rank_zero() -> bool:
    from lightning.pytorch.utilities import rank_zero_only

    return rank_zero_only.rank == 0


def instantiate_all(group: DictConfig | None) -> list[Any]:
    """Instantiate every entry with a ``_target_`` of a callbacks/logger group (entries may be null)."""
    if not group:
        return []
    return [hydra.utils.instantiate(c) for c in group.values() if isinstance(c, DictConfig) and "_target_" in c]


def drop_callbacks_needing_a_logger(callbacks: list, loggers: list) -> list:
    """``logger=none``: leave out the callbacks that only report to a logger (Lightning refuses to start them)."""
    if loggers:
        return callbacks
    from lightning.pytorch.callbacks import DeviceStatsMonitor, LearningRateMonitor

    needy = [cb for cb in callbacks if isinstance(cb, (LearningRateMonitor, DeviceStatsMonitor))]
    if needy:
        log.info(f"no logger: leaving out {', '.join(type(cb).__name__ for cb in needy)} (it reports to a logger)")
    return [cb for cb in callbacks if cb not in needy]


def with_run_checkpointing(cfg: DictConfig, callbacks: list) -> list:
    """Every run records where each checkpoint stands (``ExactResume``: a resumed run continues exactly there)
    and, unless ``trainer.enable_checkpointing=false``, keeps ``<run dir>/checkpoints/last.ckpt``: with
    ``callbacks=none`` (or ``callbacks.model_checkpoint=null``) Lightning would add its own ``ModelCheckpoint``,
    which writes under ``<run dir>/<logger>/<version>/checkpoints/`` and keeps no ``last.ckpt``."""
    from lightning.pytorch.callbacks import Checkpoint

    from ..callbacks.exact_resume import ExactResume
    from ..callbacks.run_checkpoint import RunCheckpoint

    out = [ExactResume(), *callbacks]
    if cfg.trainer.get("enable_checkpointing", True) is not False and not any(isinstance(c, Checkpoint) for c in out):
        out.append(RunCheckpoint(dirpath=str(Path(cfg.paths.output_dir) / "checkpoints"), save_last=True,
                                 save_top_k=0, enable_version_counter=False))
    return out


def _plain(node: Any) -> Any:
    """A config node resolved into plain containers; one already resolved (a dict) is copied at its top level."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def task_arguments(model_cfg: DictConfig | dict, optim: DictConfig | dict | None = None,
                   sched: DictConfig | dict | None = None) -> dict:
    """What the task of ``model_cfg`` is built from: its config without the keys that only describe it, optimized
    as the ``optim`` and ``sched`` groups say (without them: AdamW and warm-up + cosine over the model's own
    ``optimizer`` / ``scheduler`` values). Plain containers: the task's saved hyper-parameters then load with
    ``weights_only=True``."""
    cfg = _plain(model_cfg)
    # describe the model for train.py, not constructor arguments: its name, and `shortcuts`, keys like
    # `model.attention` that exist only to be interpolated into `net` from the command line
    for meta in ("name", "shortcuts", *(cfg.get("shortcuts") or [])):
        cfg.pop(meta, None)
    # the model's tuned values were read by the groups' interpolations: the task gets what to build
    for key, group in (("optimizer", optim), ("scheduler", sched)):
        if group is not None:
            cfg[key] = _plain(group)
    return cfg


def build_model(model_cfg: DictConfig | dict, optim: DictConfig | dict | None = None,
                sched: DictConfig | dict | None = None) -> L.LightningModule:
    """The task of ``model_cfg`` (see :func:`task_arguments`). Its classes are the project's own: train.py's plan
    checked them (:func:`attnlab.runs.plan.plan`); a model built here from Python is the caller's own code."""
    return hydra.utils.instantiate(task_arguments(model_cfg, optim, sched), _convert_="all")


def finish_loggers(loggers: list) -> None:
    """Close W&B after each job so that every job of a multirun sweep is its own W&B run."""
    for lg in loggers:
        if type(lg).__name__ == "WandbLogger" and rank_zero():
            import wandb

            wandb.finish()
