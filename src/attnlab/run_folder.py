"""The run folder's guard (a Hydra callback, conf/train.yaml): checks that need no model, before Hydra writes there.

Hydra creates the run folder and writes ``.hydra/`` and ``train.log`` into it before ``train.py``'s code runs. So
what must not touch a folder is decided here, in ``on_run_start`` (after the config is composed, before the folder
is created), each refusal one line and exit status 2:

* the folder cannot be created or written (a path under a file, a read-only disk): named;
* another live run writes there (``hydra.run.dir`` given twice, two ``resume=auto``): its ``.lock`` and pid named
  (:mod:`attnlab.run_lock`); a lock left by a dead process is taken over;
* ``resume=`` points at a run of another model, ``resume=auto`` finds no run of this model, or the checkpoint to
  continue from is damaged (:mod:`attnlab.resume`): nothing is written into that run.

A sweep (``-m``) locks its sweep folder in ``on_multirun_start`` and each job folder in ``on_job_start``. Only the
launching process takes locks: DDP ranks that Lightning starts re-run the script into the same folder (they carry
no Hydra callbacks, see :mod:`attnlab.ddp`), and under torchrun/SLURM only global rank 0 locks.

A run refused later by train.py (a block group the model is not built from, a bad option value) leaves its folder
only if it held something before: :func:`discard_if_unused` removes a folder this process created that holds
nothing but Hydra's files, the lock and logs.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import resume
from .errors import UserError, one_line_message
from .run_lock import LOCK_NAME, RunLock

log = logging.getLogger(__name__)

_locks: dict[Path, RunLock] = {}
_created: dict[Path, Path] = {}  # run folder -> the topmost folder this process created for it
_previous_configs: dict[Path, DictConfig] = {}  # resumed run -> its saved config from before this run


def previous_config(run_dir: str | Path) -> DictConfig | None:
    """The resumed run's ``.hydra/config.yaml`` as it was before Hydra overwrote it with this run's."""
    return _previous_configs.get(Path(run_dir).absolute())


def _launching_process() -> bool:
    """Rank 0, read from the environment the way Lightning's ``rank_zero_only`` reads it (without importing
    Lightning, which a refused command line should not pay for): torchrun/Lightning, SLURM, LSF."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key]) == 0
    return True


def _refuse(error: UserError) -> None:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise error
    log.error(one_line_message(error))
    sys.exit(error.exit_code)


class FolderError(UserError, OSError):
    """The run folder cannot be created or written."""


def claim(folder: Path) -> None:
    """Create ``folder`` (recording what this process created) and lock it; refuse in one line otherwise."""
    folder = folder.absolute()
    if folder in _locks:
        return
    top = None
    for p in (folder, *folder.parents):
        if p.exists():
            break
        top = p
    lock = RunLock(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except UserError as e:
        _refuse(e)
    except OSError as e:
        _remove_created(folder, top)
        _refuse(_folder_error(folder, e))
    _locks[folder] = lock
    if top is not None:
        _created[folder] = top


def _folder_error(folder: Path, e: OSError) -> FolderError:
    reason = e.strerror or str(e)
    where = f" ({e.filename})" if e.filename and Path(str(e.filename)) != folder else ""
    return FolderError(f"cannot create or write the run folder {folder}: {reason}{where}; "
                       f"choose another hydra.run.dir / paths.log_dir")


def release(folder: Path) -> None:
    lock = _locks.pop(Path(folder).absolute(), None)
    if lock is not None:
        lock.release()


def _release_all() -> None:
    for folder in list(_locks):
        release(folder)


atexit.register(_release_all)

_HYDRA_FILES = {"config.yaml", "hydra.yaml", "overrides.yaml"}


def discard_if_unused(folder: str | Path) -> bool:
    """Remove the run folder of a refused run if this process created it and it holds only Hydra's files, the lock,
    logs and the printed config tree (and the folders created for it, if now empty). Never a folder that existed
    before this run. True if removed."""
    folder = Path(folder).absolute()
    top = _created.get(folder)
    if top is None or not folder.is_dir():
        return False
    for entry in folder.iterdir():
        if entry.name == ".hydra" and entry.is_dir():
            if any(p.name not in _HYDRA_FILES for p in entry.iterdir()):
                return False
        elif not (entry.is_file() and (entry.name == LOCK_NAME or entry.suffix == ".log")):
            return False
    release(folder)
    shutil.rmtree(folder, ignore_errors=True)
    _remove_created(folder.parent, top if top != folder else None)
    _created.pop(folder, None)
    return True


def _remove_created(folder: Path, top: Path | None) -> None:
    """Remove the empty folders from ``folder`` up to ``top`` (the first one this process created)."""
    if top is None:
        return
    for p in (folder, *folder.parents):
        if not p.is_dir() or any(p.iterdir()):
            return
        p.rmdir()
        if p == top:
            return


def check_resume(config: DictConfig, run_dir: Path) -> None:
    """``resume=``: the folder must hold an intact checkpoint of this model; raises ResumeError (one line)."""
    value = config.get("resume")
    if value in (None, False, "", "null", "false"):
        return
    if config.get("ckpt_path"):
        raise resume.ResumeError("give either resume= or ckpt_path=, not both")
    here = resume.model_identity(config.get("model"))
    if str(value) == "auto" and not (run_dir / resume.LAST).is_file() and not run_dir.exists():
        # the resolver found no run of this model under the runs folder (it returns a new folder then)
        _, skipped = resume.find_auto(run_dir.parent, here)
        other = ""
        if skipped is not None:
            there = resume.saved_model(skipped) or (None, None)
            other = (f"; skipped the newest run {skipped}, a run of another model ("
                     f"{'; '.join(resume.model_differences(there, here)[:3])})")
        raise resume.ResumeError(f"resume=auto: no run with {resume.LAST} under {run_dir.parent} of "
                                 f"{resume.describe(here)} with this model.net{other}; give the first part's overrides")
    ckpt = resume.last_checkpoint(run_dir, value)
    there = resume.saved_model(run_dir)
    differences = resume.model_differences(there, here) if there is not None else []
    if differences:
        shown = "; ".join(differences[:3]) + ("; ..." if len(differences) > 3 else "")
        raise resume.ResumeError(f"resume={value}: {run_dir} is a run of another model ({shown}); give the first "
                                 f"part's overrides (see {run_dir / resume.SAVED_CONFIG})")
    resume.check_intact(ckpt, option="resume")
    try:
        _previous_configs[run_dir] = OmegaConf.load(run_dir / resume.SAVED_CONFIG)
    except Exception:  # noqa: BLE001 - no saved config: nothing to compare overrides with
        pass


def _run_dir(config: DictConfig) -> Path:
    """The single run's folder, ``hydra.run.dir`` resolved as Hydra will create it."""
    HydraConfig.instance().set_config(config)  # as run_job does before it resolves hydra.run.dir
    try:
        return Path(os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir"))))
    except OmegaConfBaseException as e:  # task_name=${oc.env:UNSET}: one line here, not Hydra's warning + traceback
        from .utils.validate import interpolation_message

        _refuse(FolderError(interpolation_message(e)))
        raise


class RunFolderCheck(Callback):
    """translate / generate / synthesize: the config resolves (an unset ``${oc.env:...}`` or a loop is one line, not
    a traceback from the first option read) and ``task_name`` is a folder name; a run folder that cannot be created
    (a path under a file, a read-only disk) is one line and exit 2, not the traceback of Hydra's own makedirs.

    These commands write a run folder only if they write output there (generate's samples.txt, synthesize's WAVs):
    their configs save no ``.hydra/`` and log to stderr only, and the folder Hydra creates is removed when the
    process ends if it is still empty (with the folders created for it), whether the command succeeded, was
    refused or failed. No lock: these runs only read a checkpoint and write their outputs."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = _run_dir(config)
        problem = _task_config_problem(config, folder)
        if problem:
            from .utils.config import ConfigError

            _refuse(ConfigError(problem))
        top = next((p for p in reversed([folder, *folder.parents]) if not p.exists()), None)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            _refuse(_folder_error(folder, e))
        if top is not None:
            atexit.register(_remove_if_empty, folder, top)


def _task_config_problem(config: DictConfig, folder: Path) -> str | None:
    """The first problem of the command's own config (Hydra's part left out): a value that cannot be resolved, or
    a ``task_name`` that is no folder name."""
    import copy

    from omegaconf import open_dict, read_write

    from .utils.validate import interpolation_problem, name_check

    resolved = copy.deepcopy(config)
    with read_write(resolved.hydra.runtime), open_dict(resolved.hydra.runtime):
        resolved.hydra.runtime.output_dir = str(folder)  # what paths.output_dir reads (run_job sets it so too)
    HydraConfig.instance().set_config(resolved)
    try:
        with read_write(resolved), open_dict(resolved):
            del resolved["hydra"]
        problem = _cli_override_problem(config) or interpolation_problem(resolved)
        if problem is None and "task_name" in resolved:
            bad = name_check(64, folder=True)(resolved.task_name)
            problem = bad and f"task_name={resolved.task_name}: {bad}"
        return problem
    finally:
        HydraConfig.instance().set_config(config)


def _cli_override_problem(config: DictConfig) -> str | None:
    """``+x=1`` / ``++x=1`` adding a key the command does not have (it was silently ignored), or ``~option``
    removing one of its options (an option needs a value)."""
    from .paths import CONF_DIR

    name = OmegaConf.select(config, "hydra.job.config_name")
    try:
        options = set(OmegaConf.load(CONF_DIR / f"{name}.yaml").keys()) - {"defaults", "hydra"} | {"paths"}
    except OSError:
        return None
    node = OmegaConf.select(config, "hydra.overrides.task", default=None)
    # as typed: iterating the ListConfig would resolve `beam_size=${oc.env:X}` written there
    for override in OmegaConf.to_container(node, resolve=False) if node is not None else []:
        override = str(override)
        if not override.startswith(("+", "~")) or override.lstrip("+~").startswith("hydra"):
            continue
        key = override.lstrip("+~").split("=", 1)[0]
        top = key.split(".", 1)[0]
        if override.startswith("~") and top in options:
            return f"{override}: {name} needs its option {key}; give it a value ({key}=...) instead"
        if override.startswith("+") and top not in options:
            return f"{override}: {name} has no option {top} (its options: {', '.join(sorted(options))})"
    return None


def _remove_if_empty(folder: Path, top: Path) -> None:
    """At exit: the run folder and the folders created for it, each only if empty (never a file is removed)."""
    try:
        _remove_created(folder, top)
    except OSError:
        pass


class RunFolderGuard(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _launching_process():
            return
        run_dir = _run_dir(config)
        try:
            check_resume(config, run_dir)
        except UserError as e:
            _refuse(e)
        claim(run_dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _launching_process():
            return
        HydraConfig.instance().set_config(config)
        claim(Path(os.path.abspath(str(OmegaConf.select(config, "hydra.sweep.dir")))))

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if _launching_process():  # a single run: already claimed in on_run_start; a sweep's job: its own folder
            claim(Path(config.hydra.runtime.output_dir))

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        release(Path(config.hydra.runtime.output_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        _release_all()
