"""Plan a training run once, then run it: :func:`preflight` turns ``train.py``'s composed config into a
:class:`RunPlan` — every value checked, the config resolved once, the checkpoint it continues from read and trusted
once, the loggers named — and ``train.run(plan)`` builds and fits from the plan alone, re-reading and re-checking
nothing.

Every refusal of a bad value, file or checkpoint happens here, in one line, before Lightning is imported (and before
torch, unless a checkpoint has to be read); ``resume=`` is checked even earlier, by the Hydra callback that guards
the run folder (:mod:`attnlab.runs.folder`), which hands its read of the checkpoint to the plan.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf, open_dict

from . import resume, folder as run_folder
from ..checkpoints.allowed_targets import check_targets
from ..checkpoints.exported import is_exported
from ..core.errors import ConfigError
from ..files.folder_paths import names_a_local_checkpoint
from ..files.log_file import raise_if_failed
from .build import task_arguments
from .config_tree import auto_tags, check_block_groups, print_config_tree, used_groups
from .sweep import WANDB_TAG_MAX, setting_name, setting_overrides
from .validate import memory_check, validate_config

if TYPE_CHECKING:
    from ..checkpoints.read import TrustedCheckpoint

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RunPlan:
    """A training run as checked and decided before anything is built."""

    cfg: DictConfig  # as composed, with resume='s checkpoint and W&B run filled in: what Hydra instantiates
    resolved: dict  # ``cfg`` resolved once into plain containers: what the loggers record
    model: dict  # what the task is built from (:func:`attnlab.runs.build.task_arguments`), its classes checked
    run_dir: Path
    overrides: tuple[str, ...] = ()  # the command line's (a sweep's job: its own)
    checkpoint: TrustedCheckpoint | None = None  # the file ckpt_path= / resume= names, read and trusted once
    resuming: bool = False  # resume=: continue this folder's run (its W&B run too)
    notes: list[str] = field(default_factory=list)  # warnings for the log, once the run's log exists

    @property
    def option(self) -> str:
        """How the command line named the checkpoint: ``resume`` or ``ckpt_path``."""
        return "resume" if self.resuming else "ckpt_path"


def plan(cfg: DictConfig, overrides: list[str] | tuple[str, ...] | None = None,
         checkpoint: TrustedCheckpoint | None = None) -> RunPlan:
    """The plan of a config whose values are checked (:func:`preflight`), or composed in Python (the tests, the
    notebooks, the benchmarks): the model's classes are the project's own, the checkpoint ``ckpt_path`` names is
    read and trusted (unless given), the loggers named. ``overrides``: the command line's (default: this Hydra
    job's)."""
    overrides = task_overrides() if overrides is None else list(overrides)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    model = task_arguments(resolved["model"], resolved.get("optim"), resolved.get("sched"))
    check_targets(model, "model")  # what the checkpoint will hold: only classes every loader accepts
    resuming = bool(cfg.get("resume"))
    if checkpoint is None and names_a_local_checkpoint(cfg.get("ckpt_path")):
        from .load import for_training  # (torch: only for a checkpoint)

        checkpoint = for_training(cfg.ckpt_path, cfg.model, "resume" if resuming else "ckpt_path")
    prepare_loggers(cfg, overrides, net=resolved["model"].get("net"))
    if (cfg.get("logger") or {}).get("wandb"):  # the run's name, group and tags just set
        resolved["logger"] = OmegaConf.to_container(cfg.logger, resolve=True)
    return RunPlan(cfg=cfg, resolved=resolved, model=model, run_dir=Path(cfg.paths.output_dir),
                   overrides=tuple(overrides), checkpoint=checkpoint, resuming=resuming)


def preflight(cfg: DictConfig, overrides: Sequence[str], run_dir: Path) -> RunPlan:
    """``train.py``'s checks, each once, in the order a user would want to hear of them; a refusal is one line
    (a :class:`~attnlab.core.errors.UserError`). ``overrides``: this job's command line; ``run_dir``: its folder."""
    raise_if_failed()  # Hydra's first lines into train.log found the disk full
    if cfg.get("init_from"):  # the folder's model replaces the config's, before anything is checked
        from . import init_from

        init_from.apply(cfg, overrides)
    # bad values (n_heads=0, seed=-1, task_name=nan, an unset ${oc.env:...}, +attn.foo=1, a model too big to fit):
    # one line naming the key, before anything is built or torch imported
    resolved = validate_config(cfg, overrides, memory=False)
    from .ddp import check_world_size

    check_world_size(resolved["trainer"])  # torchrun's processes against trainer.num_nodes × devices
    check_block_groups(cfg, overrides, resolved["model"].get("net"))
    from .data_check import check_data

    check_data(resolved["data"], cfg.model.get("name"))  # every data file read, before torch (data/preflight.py)
    notes: list[str] = []
    checkpoint = None
    if cfg.get("resume"):
        notes += continue_run(cfg, run_dir)
        checkpoint = run_folder.checked_checkpoint(run_dir)  # read and trusted before Hydra wrote here
    named = str(cfg.get("ckpt_path") or "")
    if names_a_local_checkpoint(named) and not (Path(named).expanduser().is_file() or is_exported(named)):
        raise ConfigError(f"checkpoint not found: {Path(named).expanduser().resolve()}")  # (before torch)
    the_plan = plan(cfg, list(overrides), checkpoint)  # (checked: now they may resolve)
    checkpoint = the_plan.checkpoint
    if checkpoint is not None and checkpoint.exported and cfg.get("train"):
        raise ConfigError(f"ckpt_path={named} is an exported model (weights, no training state): train=false "
                          f"tests it; a run cannot continue from it")
    if checkpoint is not None and not the_plan.resuming and cfg.get("train"):
        # a new run from the checkpoint's training state trains on its data (resume=: checked by the folder guard)
        resume.check_checkpoint_data(checkpoint.contents, checkpoint.path, cfg.data)
        resume.check_left_to_train(checkpoint.contents, checkpoint.path, cfg.trainer)
    memory_check(cfg, resolved)  # (builds the net on torch's meta device: after the cheaper refusals)
    from .hardware import slow_bf16_warning

    slow = slow_bf16_warning(cfg.trainer.get("precision"), cfg.trainer.get("accelerator", "auto"))
    the_plan.notes.extend([*notes, *([slow] if slow else [])])
    return the_plan


def continue_run(cfg: DictConfig, run_dir: Path) -> list[str]:
    """resume=…: Hydra already put us in the run's folder (run_folder.RunFolderGuard checked it holds an intact
    checkpoint of this model); start from its last.ckpt, log to its W&B run. Returns the warnings to log."""
    if cfg.get("ckpt_path"):
        raise ConfigError("give either resume= or ckpt_path=, not both")
    with open_dict(cfg):
        cfg.ckpt_path = str(resume.last_checkpoint(run_dir, cfg.resume))
        wb = (cfg.get("logger") or {}).get("wandb")
        if wb is not None and not wb.get("id"):
            wb.id = resume.previous_wandb_id(run_dir)
    if run_folder.launching_process():  # (a DDP rank re-runs this job: the files are rank 0's)
        _remove_half_written(Path(cfg.ckpt_path).parent)
    picked = f" (resume=auto: the newest run of model={cfg.model.get('name')} with this model.net)" \
        if str(cfg.resume) == "auto" else ""
    if str(cfg.resume) == "auto" and (skipped := run_folder.skipped_by_auto(run_dir)):
        picked += f"; newer runs of other models skipped: {skipped}"
    log.info(f"resuming {run_dir}{picked} from {cfg.ckpt_path}" + (f", W&B run {wb.id}" if wb is not None else ""))
    return resume.overridden_by_checkpoint(run_folder.previous_config(run_dir), cfg)


def _remove_half_written(ckpt_dir: Path) -> None:
    """Temporary files of checkpoint writes that a killed run never finished (utils/checkpoint_io.py names them
    ``.<name>.<pid>.tmp``); the run lock guarantees that no other process writes this folder now."""
    for tmp in sorted(ckpt_dir.glob(".*.ckpt.*.tmp")):
        log.info(f"removing {tmp.name}: a checkpoint write the stopped run did not finish")
        tmp.unlink(missing_ok=True)


def prepare_loggers(cfg: DictConfig, overrides: list[str] | tuple[str, ...] | None = None,
                    net: dict | None = None) -> None:
    """Fill W&B run name, group and tags from the chosen groups, unless the config sets them.

    The group is the job's setting: the experiment (or model) name and the command line's overrides minus ``seed``
    and run bookkeeping (:func:`~attnlab.runs.sweep.setting_name`), so the seeds of ``-m norm=pre,rms
    seed=0,1,2`` land in two groups that W&B's "group by" averages; each run is also tagged ``seed=<n>`` and with
    every override of its setting. ``overrides``: the command line's (default: this Hydra job's). ``net``:
    ``model.net`` already resolved."""
    wb = (cfg.get("logger") or {}).get("wandb")
    if not wb:
        return
    overrides = list(task_overrides() if overrides is None else overrides)
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


def task_overrides() -> list[str]:
    """This Hydra job's command-line overrides (none outside a Hydra run, e.g. a config composed by hand)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


def print_plan(the_plan: RunPlan, threads_line: str) -> None:
    """The config tree (also saved as ``config_tree.log``), the threads chosen and the plan's warnings."""
    print_config_tree(the_plan.resolved, save_to=the_plan.run_dir / "config_tree.log")
    log.info(threads_line)
    for note in the_plan.notes:
        log.warning(note)
