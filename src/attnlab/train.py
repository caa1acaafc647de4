"""Training entry point: ``python train.py [group=option ...] [key=value ...]`` (or ``attnlab-train``).

Composes conf/train.yaml, builds data, model, callbacks, loggers and trainer from it, fits, tests with the best
checkpoint, and returns ``optimized_metric`` for sweepers. Each Hydra job (single run or one job of ``-m``) is one
run directory and one W&B run.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from . import ddp, resume, run_folder
from .allowed_targets import check_targets
from .atomic_files import disk_full, write_atomic
from .errors import CheckpointWriteError, ConfigError, NonFiniteLossError, find_user_error, one_line_message
from .log_file import raise_if_failed, watch_file_handlers
from .paths import CONF_DIR
from .quoting import shell_override
from .utils import threads
from .utils.hardware import slow_bf16_warning
from .utils.run_summary import summary_lines
from .utils.sweep import WANDB_TAG_MAX, one_line, setting_name, setting_overrides, write_job_status, write_summary
from .utils.config import auto_tags, check_block_groups, flatten, print_config_tree, used_groups
from .utils.validate import validate_config

if TYPE_CHECKING:
    import lightning as L

    from .callbacks.stage_signals import StageSignals

# Lightning (~4 s of imports on a small CPU) is imported only once the config has passed its checks, so a refused
# command line answers in about a second (and the tests that provoke refusals stay cheap).

log = logging.getLogger(__name__)


def _rank_zero() -> bool:
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

    from .callbacks.exact_resume import ExactResume
    from .callbacks.run_checkpoint import RunCheckpoint

    out = [ExactResume(), *callbacks]
    if cfg.trainer.get("enable_checkpointing", True) is not False and not any(isinstance(c, Checkpoint) for c in out):
        out.append(RunCheckpoint(dirpath=str(Path(cfg.paths.output_dir) / "checkpoints"), save_last=True,
                                 save_top_k=0, enable_version_counter=False))
    return out


def _plain(node: Any) -> Any:
    """A config node resolved into plain containers; one already resolved (a dict) is copied at its top level."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def build_model(model_cfg: DictConfig | dict, optim: DictConfig | dict | None = None,
                sched: DictConfig | dict | None = None) -> L.LightningModule:
    """The task of ``model_cfg``, optimized as the ``optim`` and ``sched`` groups say (without them: AdamW and
    warm-up + cosine over the model's own ``optimizer`` / ``scheduler`` values). Each is a config node or the plain
    containers it resolves to (train.py resolves the whole config once)."""
    cfg = _plain(model_cfg)
    # describe the model for train.py, not constructor arguments: its name, and `shortcuts`, keys like
    # `model.attention` that exist only to be interpolated into `net` from the command line
    for meta in ("name", "shortcuts", *(cfg.get("shortcuts") or [])):
        cfg.pop(meta, None)
    # the model's tuned values were read by the groups' interpolations: the task gets what to build
    for key, group in (("optimizer", optim), ("scheduler", sched)):
        if group is not None:
            cfg[key] = _plain(group)
    check_targets(cfg, "model")  # what the checkpoint will hold: only classes every loader accepts
    # plain dicts, not DictConfigs, reach the task: its saved hyper-parameters then load with weights_only=True
    return hydra.utils.instantiate(cfg, _convert_="all")


def prepare_loggers(cfg: DictConfig, overrides: list[str] | None = None, net: dict | None = None) -> None:
    """Fill W&B run name, group and tags from the chosen groups, unless the config sets them.

    The group is the job's setting: the experiment (or model) name and the command line's overrides minus ``seed``
    and run bookkeeping (:func:`~attnlab.utils.sweep.setting_name`), so the seeds of ``-m norm=pre,rms
    seed=0,1,2`` land in two groups that W&B's "group by" averages; each run is also tagged ``seed=<n>`` and with
    every override of its setting. ``overrides``: the command line's (default: this Hydra job's). ``net``:
    ``model.net`` already resolved."""
    wb = (cfg.get("logger") or {}).get("wandb")
    if not wb:
        return
    if overrides is None:
        overrides = _task_overrides()
    uses = used_groups(cfg, net=net)
    tags = auto_tags(cfg, uses)
    # the prefix names the experiment (or the model): the override that chose it is not repeated after it
    prefix = cfg.get("experiment_name") or str(cfg.model.get("name"))
    drop = ("experiment", "experiment_name") if cfg.get("experiment_name") else ("model",)
    setting = setting_overrides(overrides)
    tags += [t for t in setting if t not in tags and len(t) <= WANDB_TAG_MAX]
    tags.append(f"seed={cfg.get('seed')}")
    with open_dict(cfg):
        wb.tags = wb.tags or tags
        wb.group = wb.group or setting_name(overrides, prefix, drop)
        groups = tuple(f"{g}=" for g in uses)  # run name: the model and its group choices
        wb.name = wb.name or "-".join([tags[0]] + [t.split("=")[-1] for t in tags[1:] if t.startswith(groups)])


def _task_overrides() -> list[str]:
    """This Hydra job's command-line overrides (none outside a Hydra run, e.g. a config composed by hand)."""
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


def run(cfg: DictConfig, resolved: dict | None = None, stops: StageSignals | None = None) -> dict[str, float]:
    """Fit and test as the config says; return the final metrics (floats). ``resolved``: ``cfg`` already resolved
    into plain containers (else resolved here); the model is built from it and the loggers record it. ``stops``:
    the stop signals between the stages (installed by the caller around this call)."""
    import lightning as L

    from .callbacks.stage_signals import StageSignals

    from .checkpoints import check_file_fits

    from .utils.console import tidy_lightning_output, without_wandb_notices

    tidy_lightning_output()
    config = OmegaConf.to_container(cfg, resolve=True) if resolved is None else resolved
    ddp.install()  # before the Trainer exists: DDP ranks re-run this job's saved config (see ddp.py)
    L.seed_everything(cfg.seed, workers=True)
    datamodule: L.LightningDataModule = hydra.utils.instantiate(cfg.data)
    model = build_model(config["model"], config.get("optim"), config.get("sched"))
    check_file_fits(model, cfg.get("ckpt_path"))  # ckpt_path=/resume= of other sizes or parts: one line, no logger yet
    if _rank_zero():
        # the data read (and the cache built) before any logger, checkpoint or trainer exists: a bad file is one line
        # and the refused run leaves no folder; every data module's setup is idempotent (Lightning's own call then
        # returns at once), and nothing between here and it draws from the random generators
        datamodule.prepare_data()
        datamodule.setup("fit")
    ckpt_file = cfg.get("ckpt_path") and Path(str(cfg.ckpt_path)).is_file()  # resume= sets ckpt_path too
    if ckpt_file and _rank_zero() and hasattr(datamodule, "tokenizer"):
        resume.check_tokenizer(cfg.ckpt_path, datamodule, "resume" if cfg.get("resume") else "ckpt_path")
    prepare_loggers(cfg, net=config["model"].get("net"))
    if (cfg.get("logger") or {}).get("wandb"):  # the run's name, group and tags that prepare_loggers set
        config["logger"] = OmegaConf.to_container(cfg.logger, resolve=True)
    callbacks = instantiate_all(cfg.get("callbacks"))
    loggers = instantiate_all(cfg.get("logger"))
    callbacks = drop_callbacks_needing_a_logger(callbacks, loggers)
    callbacks = with_run_checkpointing(cfg, callbacks)
    from .callbacks.run_log import RunLogCheck

    callbacks.append(RunLogCheck())  # a full disk under a log file (train.log, W&B's) stops the run at the next batch
    stops = stops if stops is not None else StageSignals()
    callbacks.append(stops)
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)

    without_wandb_notices(loggers)
    for lg in loggers:
        lg.experiment  # noqa: B018 - starts W&B's run (wandb.init adds its debug.log handler)
    watch_file_handlers()  # a full disk under W&B's folder: one line at the next batch, not a traceback per record
    for lg in loggers:
        lg.log_hyperparams(flatten(config))

    metrics: dict[str, float] = {}
    with ddp.distributed_job():
        try:
            _fit_and_test(cfg, trainer, model, datamodule, metrics, stops)
        finally:
            finish_loggers(loggers)
    return metrics


def _fit_and_test(cfg: DictConfig, trainer: L.Trainer, model, datamodule, metrics: dict, stops: StageSignals) -> None:
    from .checkpoints import release, verified  # weights_only=True, refusals are one line

    if cfg.get("train"):
        ckpt_path = verified(cfg.get("ckpt_path"))  # from the read every check of it shared
        release()  # that read's tensors: Lightning reads the file itself
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        from .callbacks.exact_resume import restored_metrics

        # a part resumed after (or near) the end of training logged little or nothing itself
        metrics.update(restored_metrics(trainer))
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
        from .callbacks.preemption import preemption_signal

        if signame := preemption_signal(trainer):
            _interrupted(cfg, signame, "in training: not testing")
        stops.between = True  # (also when nothing was left to train: fit then runs no training stage)
    if stops.received:
        _interrupted(cfg, stops.received, "after training, before the test: not tested")
    if cfg.get("test"):
        from .callbacks.preemption import TestInterrupted

        # After training: the best checkpoint (the last weights if none was kept). Test only: ckpt_path.
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") if cfg.get("train") else ""
        ckpt = best or (None if cfg.get("train") else cfg.get("ckpt_path"))
        ckpt = verified(ckpt)
        release()
        try:
            trainer.test(model, datamodule=datamodule, ckpt_path=ckpt, weights_only=True)
        except TestInterrupted as e:
            _interrupted(cfg, e.signame, "in the test: no metrics.json")
        stops.between = True
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})


def _interrupted(cfg: DictConfig, signame: str, where: str) -> None:
    """A preemption or Ctrl+C stopped the run (its state is in last.ckpt): marked interrupted in job_status.json,
    exit 0 (SIGTERM, SIGUSR1: a scheduler's requeue) or 130 (Ctrl+C, the shell's status for an interrupt). The
    machine is going away: a sweep stops here too; resume= continues this job (and runs its test)."""
    run_dir = Path(cfg.paths.output_dir)
    if _rank_zero():
        write_job_status(run_dir, _task_overrides(), interrupted=signame)
    log.warning(f"stopped by {signame} {where}; continue with {shell_override('resume', run_dir)}")
    _stop_sweep(cfg, signame)


def _stop_sweep(cfg: DictConfig, signame: str) -> None:
    """End the process for a stop signal: 130 for Ctrl+C (the shell's status for an interrupt), 0 for a scheduler's
    SIGTERM/SIGUSR1 (a requeue). In a sweep the later jobs are not started, and the summary says so."""
    if _in_sweep() and _rank_zero():
        write_summary(Path(HydraConfig.get().sweep.dir), cfg.get("optimized_metric"), stopped_by=signame)
    raise SystemExit(130 if signame == "SIGINT" else 0)


def _in_sweep() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # a config composed by hand, outside a Hydra run
        return False


def write_metrics(run_dir: Path, metrics: dict[str, float]) -> None:
    """The run's final metrics as ``<run dir>/metrics.json``: what scripts (the claims report, notebooks) read back
    without parsing W&B's binary files. Written through a temporary file so a crash never leaves half of it."""
    write_atomic(run_dir / "metrics.json", json.dumps(metrics, indent=1, sort_keys=True))


def finish_loggers(loggers: list) -> None:
    """Close W&B after each job so that every job of a multirun sweep is its own W&B run."""
    for lg in loggers:
        if type(lg).__name__ == "WandbLogger" and _rank_zero():
            import wandb

            wandb.finish()


_job_started = False  # set when Hydra calls the job: a Hydra error before that is a bad command line
_late_stop: str | None = None  # a stop signal received after a job's test (its results were written)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def _main(cfg: DictConfig) -> float | None:
    global _job_started
    _job_started = True
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir)
    in_sweep = hc.mode == RunMode.MULTIRUN
    try:
        value = train_job(cfg, hc)
    except (NonFiniteLossError, CheckpointWriteError) as e:  # diverged / disk full: one line; last.ckpt is kept
        log.error(str(e))
        if in_sweep:
            write_job_status(job_dir, hc.overrides.task, error=e)
            return float("nan")
        sys.exit(1)
    except Exception as e:
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
        if not in_sweep:
            raise
        # One failing job (a diverging lr, a bad option) must not end the sweep: log it, record it, go on.
        log.exception(f"job {hc.job.num} failed: {one_line(e)}")
        write_job_status(job_dir, hc.overrides.task, error=e)
        return float("nan")
    if in_sweep and _rank_zero():
        write_job_status(job_dir, hc.overrides.task, value=value)
    if not in_sweep and _rank_zero():  # the last lines: where everything is, what to run next
        log.info("\n".join(summary_lines(cfg, job_dir, hc.overrides.task)))
    if in_sweep and _late_stop:
        _stop_sweep(cfg, _late_stop)
    return value


def continue_run(cfg: DictConfig, run_dir: Path) -> None:
    """resume=…: Hydra already put us in the run's folder (run_folder.RunFolderGuard checked it holds an intact
    checkpoint of this model); start from its last.ckpt, log to its W&B run."""
    if cfg.get("ckpt_path"):
        raise ConfigError("give either resume= or ckpt_path=, not both")
    with open_dict(cfg):
        cfg.ckpt_path = str(resume.last_checkpoint(run_dir, cfg.resume))
        wb = (cfg.get("logger") or {}).get("wandb")
        if wb is not None and not wb.get("id"):
            wb.id = resume.previous_wandb_id(run_dir)
    if _rank_zero():
        _remove_half_written(Path(cfg.ckpt_path).parent)
    picked = f" (resume=auto: the newest run of model={cfg.model.get('name')} with this model.net)" \
        if str(cfg.resume) == "auto" else ""
    if str(cfg.resume) == "auto" and (skipped := run_folder.skipped_by_auto(run_dir)):
        picked += f"; newer runs of other models skipped: {skipped}"
    log.info(f"resuming {run_dir}{picked} from {cfg.ckpt_path}" + (f", W&B run {wb.id}" if wb is not None else ""))
    for warning in resume.overridden_by_checkpoint(run_folder.previous_config(run_dir), cfg):
        log.warning(warning)


def _remove_half_written(ckpt_dir: Path) -> None:
    """Temporary files of checkpoint writes that a killed run never finished (utils/checkpoint_io.py names them
    ``.<name>.<pid>.tmp``); the run lock guarantees that no other process writes this folder now."""
    for tmp in sorted(ckpt_dir.glob(".*.ckpt.*.tmp")):
        log.info(f"removing {tmp.name}: a checkpoint write the stopped run did not finish")
        tmp.unlink(missing_ok=True)


def train_job(cfg: DictConfig, hc) -> float | None:
    # bad values (n_heads=0, seed=-1, task_name=nan, an unset ${oc.env:...}, +attn.foo=1, a model too big to fit):
    # one line naming the key, before anything is built or Lightning imported; the folder is then discarded
    raise_if_failed()  # Hydra's first lines into train.log found the disk full
    resolved = validate_config(cfg, hc.overrides.task)  # the whole config, resolved once
    check_block_groups(cfg, hc.overrides.task, resolved["model"].get("net"))
    check_targets(cfg.model, "model")  # the classes its checkpoint will name: ones every loader accepts
    if cfg.get("resume"):
        continue_run(cfg, Path(hc.runtime.output_dir))
        resolved = OmegaConf.to_container(cfg, resolve=True)  # with the checkpoint and W&B run it continues
    if cfg.get("ckpt_path") and not cfg.get("resume") and Path(str(cfg.ckpt_path)).is_file():
        # (resume=: checked by run_folder.RunFolderGuard; "last"/"best" and URLs are Lightning's to find)
        resume.check_intact(cfg.ckpt_path, option="ckpt_path")
    named = str(cfg.get("ckpt_path") or "")
    if named and named not in ("last", "best", "hpc") and "://" not in named and not Path(named).expanduser().is_file():
        raise ConfigError(f"checkpoint not found: {Path(named).expanduser().resolve()}")  # (before torch is imported)
    ckpt = None
    if cfg.get("ckpt_path"):  # (torch is imported only for a checkpoint: a refusal before it answers sooner)
        from .checkpoints import check_for_model

        ckpt = check_for_model(cfg.ckpt_path, cfg.model)  # data only, this model's family: before Lightning
    if ckpt is not None and not cfg.get("resume") and cfg.get("train"):
        # a new run from the checkpoint's training state trains on its data (resume=: checked by RunFolderGuard)
        resume.check_checkpoint_data(ckpt, cfg.ckpt_path, cfg.data)
        resume.check_left_to_train(ckpt, cfg.ckpt_path, cfg.trainer)
    del ckpt  # (memory-mapped)
    slow = slow_bf16_warning(cfg.trainer.get("precision"), cfg.trainer.get("accelerator", "auto"))
    if slow:
        log.warning(slow)
    # after every refusal (torch is imported here, a refusal before it answers sooner), before any thread starts
    chosen = threads.apply(resolved.get("threads", "auto"), threads.ranks_of(resolved["trainer"]))  # per DDP rank
    if _rank_zero():
        print_config_tree(resolved, save_to=Path(hc.runtime.output_dir) / "config_tree.log")
        log.info(chosen.line())
    from .callbacks.stage_signals import StageSignals

    stops = StageSignals()
    with stops.installed():  # until the results are written: a stop after the test waits for them
        metrics = run(cfg, resolved, stops)
        if _rank_zero():
            write_metrics(Path(hc.runtime.output_dir), metrics)
    global _late_stop
    if stops.received:
        log.warning(f"received {stops.received} after the test: the run had finished, its results are written")
        _late_stop = stops.received  # a sweep writes this job's status, then stops
    raise_if_failed()  # the run is done and its results written; its log is not complete
    name = cfg.get("optimized_metric")
    if name and name in metrics:
        log.info(f"{name} = {metrics[name]:.4f}")
        return metrics[name]
    return None


def main() -> None:
    from .hydra_errors import one_line_hydra_errors

    try:
        one_line_hydra_errors(_main, lambda: _job_started)
    except SystemExit as e:
        # Hydra reports a bad command line (an unknown group option or key, a malformed override) with its own
        # message and exit status 1; like every other bad input here it exits with 2. The exception Hydra
        # printed is the context of its sys.exit(1); once a job has started, exit 1 is the job's (a bug, a sweep).
        if e.code == 1 and not _job_started and _is_hydra_config_error(e.__context__):
            raise SystemExit(2) from None
        raise


def _is_hydra_config_error(error: BaseException | None) -> bool:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(error, (HydraException, OmegaConfBaseException))


if __name__ == "__main__":
    main()
