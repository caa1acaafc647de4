"""The run folder's guard (a Hydra callback, conf/train.yaml): checks that need no model, before Hydra writes there.

Hydra creates the run folder and writes ``.hydra/`` and ``train.log`` into it before ``train.py``'s code runs. So
what must not touch a folder is decided here, in ``on_run_start`` (after the config is composed, before the folder
is created), each refusal one line and exit status 2:

* the folder cannot be created or written (a path under a file, a read-only disk): named;
* another live run writes there (``hydra.run.dir`` given twice, two ``resume=auto``): its ``.lock`` and pid named
  (:mod:`attnlab.runs.lock`); a lock left by a dead process is taken over;
* a new run (not ``resume=``) into a folder that already holds anything (a finished or a killed run: ``.hydra/``,
  checkpoints, ``metrics.json``, ``wandb/``, ...; for ``-m``, a used sweep folder): the entries are named, with
  ``resume=<dir>`` and another ``hydra.run.dir`` as the ways on; ``existing_run=move_aside`` renames the old run
  to ``<dir>.old-<stamp>`` first (nothing is ever deleted);
* ``resume=`` points at a run of another model or of other data (:mod:`attnlab.runs.resume` names the keys),
  ``resume=auto`` finds no run of this model or the newest one has no checkpoint, or the checkpoint to continue
  from is damaged: nothing is written into that run.

No setting turns a refusal into a warning: Hydra's callback wrapper catches every ``Exception`` a callback raises
and only warns, so a refusal here is always ``sys.exit`` (a ``SystemExit`` passes through it), and an unexpected
error in a check exits too (status 1, with its traceback). ``HYDRA_FULL_ERROR=1`` adds the refusal's traceback.

A sweep (``-m``) locks its sweep folder in ``on_multirun_start`` and each job folder in ``on_job_start``. Only the
launching process takes locks: DDP ranks that Lightning starts re-run the script into the same folder (they carry
no Hydra callbacks, see :mod:`attnlab.runs.ddp`), and under torchrun/SLURM only global rank 0 locks.

A run refused later by train.py (a block group the model is not built from, a bad option value) leaves its folder
only if it held something before: :func:`discard_if_unused` removes a folder this process created that holds
nothing but Hydra's files, the lock and logs.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from . import resume
from .ddp import launching_process, outside_rank
from ..core.errors import ConfigError, FolderError, UsedFolderError, UserError, one_line_message
from ..files.folder_paths import aside_name, check_no_links
from .lock import LOCK_NAME, RunLock
from .sweep_continue import check_sweep_resume

if TYPE_CHECKING:
    from ..checkpoints.read import TrustedCheckpoint

log = logging.getLogger(__name__)

_locks: dict[Path, RunLock] = {}
_created: dict[Path, Path] = {}  # run folder -> the topmost folder this process created for it
_found_empty: set[Path] = set()  # run folders that existed, empty, before this process
_previous_configs: dict[Path, DictConfig] = {}  # resumed run -> its saved config from before this run
_checkpoints: dict[Path, TrustedCheckpoint] = {}  # resumed run -> its checkpoint, read and trusted


_auto_skipped: dict[Path, str] = {}  # resume=auto: the newer runs (of other models) it passed over


def skipped_by_auto(run_dir: str | Path) -> str:
    """resume=auto: the newer runs of other models that it passed over to reach ``run_dir`` ("" if none)."""
    return _auto_skipped.get(Path(run_dir).absolute(), "")


def checked_checkpoint(run_dir: str | Path) -> TrustedCheckpoint | None:
    """``resume=``: the checkpoint this Hydra callback read and trusted before Hydra wrote into the run's folder
    (None in a DDP rank or a sweep's job, which read it in their own plan)."""
    return _checkpoints.pop(Path(run_dir).absolute(), None)


def previous_config(run_dir: str | Path) -> DictConfig | None:
    """The resumed run's ``.hydra/config.yaml`` as it was before Hydra overwrote it with this run's."""
    return _previous_configs.get(Path(run_dir).absolute())


def _refuse(error: UserError) -> None:
    """One line and the error's exit status; never an exception, which Hydra's callback wrapper would turn into a
    warning and go ahead with the run."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        traceback.print_exception(error)
    log.error(one_line_message(error))
    sys.exit(error.exit_code)


def _never_swallowed(hook):
    """A hook whose failure stops the run: an unexpected error (a bug in a check) exits with status 1 and its
    traceback instead of reaching Hydra's wrapper, which would only warn."""

    @functools.wraps(hook)
    def guarded(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except UserError as e:
            _refuse(e)
        except Exception:  # noqa: BLE001
            log.exception(f"run folder check {hook.__name__} failed; the run is not started")
            sys.exit(1)

    return guarded


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
    elif not _contents(folder):
        _found_empty.add(folder)  # a refused run leaves it empty again (and in place)


def _folder_error(folder: Path, e: OSError) -> FolderError:
    reason = e.strerror or str(e)
    where = f" ({e.filename})" if e.filename and Path(str(e.filename)) != folder else ""
    return FolderError(f"cannot create or write the run folder {folder}: {reason}{where}; "
                       f"choose another hydra.run.dir / paths.log_dir")


EXISTING_RUN_CHOICES = ("refuse", "move_aside")


def _contents(folder: Path) -> list[str]:
    """What ``folder`` holds, for the message, the entries that name a run first: ``checkpoints/ (epoch_000.ckpt,
    last.ckpt)``, ``metrics.json``, ``.hydra/``... Empty for a folder that does not exist or holds only a lock."""
    if not folder.is_dir():
        return []
    order = {name: i for i, name in enumerate(_TELLING)}
    out = []
    for e in sorted(folder.iterdir(), key=lambda e: (order.get(e.name, len(order)), e.name)):
        if e.name == LOCK_NAME or _other_nodes_log(e):
            continue
        if e.is_dir() and not e.is_symlink():
            inner = sorted(p.name for p in e.iterdir())
            shown = ", ".join(inner[:3]) + (", ..." if len(inner) > 3 else "")
            out.append(f"{e.name}/ ({shown})" if e.name == "checkpoints" and inner else f"{e.name}/")
        else:
            out.append(e.name)
    return out


def _other_nodes_log(entry: Path) -> bool:
    """Under an outside launcher (torchrun on each node), the other nodes' processes of this run or sweep log into
    its folder (``rank<N>.log``, a sweep's ``<job>/rank<N>.log``) as soon as they start, maybe before rank 0 checks
    the folder: not an earlier run's files (a node that started first made rank 0 refuse, and the others wait)."""
    if outside_rank() is None:
        return False
    if entry.is_dir() and not entry.is_symlink() and entry.name.isdigit():
        return all(_other_nodes_log(e) for e in entry.iterdir())
    return entry.is_file() and re.fullmatch(r"rank\d+\.log", entry.name) is not None


# what names a run best, first in the message
_TELLING = ["checkpoints", "metrics.json", "job_status.json", ".hydra", "multirun.yaml", "sweep_summary.md",
            "wandb", "csv", "tensorboard", "train.log"]


def check_unused(folder: Path, config: DictConfig, kind: str = "run") -> bool:
    """A new run goes into a new or empty folder. One that holds anything is refused, naming what is there and the
    ways on, unless ``existing_run=move_aside``: then True (move it aside once the folder is locked). A live run's
    lock is reported as such first; nothing in the folder is touched. ``kind``: "run" or "sweep"."""
    choice = str(config.get("existing_run") or "refuse")
    if choice not in EXISTING_RUN_CHOICES:
        raise UsedFolderError(f"existing_run={choice} is not one of {', '.join(EXISTING_RUN_CHOICES)}")
    try:
        found = _contents(folder)
    except OSError as e:
        raise _folder_error(folder, e) from None
    if not found:
        return False
    RunLock(folder).probe()  # a live run writes there: that is the message
    if choice == "move_aside":
        return True
    key = "hydra.sweep.dir" if kind == "sweep" else "hydra.run.dir"
    what = ", ".join(found[:6]) + (", ..." if len(found) > 6 else "")
    if kind == "run" and (folder / resume.LAST).is_file():
        ways = f"continue it with resume={folder}, or give this run another {key}"
    elif kind == "run" and (folder / resume.SAVED_CONFIG).is_file():
        ways = f"it has no {resume.LAST} to resume from; give this run another {key}"
    else:
        ways = f"give this {kind} another {key}"
    held = "a run" if kind == "run" and any(f.split("/")[0] in _TELLING for f in found) else \
        "a sweep" if kind == "sweep" and any(f.split("/")[0] in _TELLING or f[0].isdigit() for f in found) else "files"
    raise UsedFolderError(f"{kind} folder {folder} already holds {held} ({what}); {ways}, or add "
                          f"existing_run=move_aside to move it to {folder}.old-<time> first")


def _move_aside(folder: Path) -> None:
    """Rename the locked ``folder`` to ``<folder>.old-<time>`` (its lock file goes with it), then lock a new, empty
    ``folder``; said in a warning. Nothing is deleted."""
    folder = folder.absolute()
    what = ", ".join(_contents(folder)[:6])
    aside = aside_name(folder)
    old = _locks.pop(folder)
    try:
        folder.rename(aside)
    except OSError as e:
        _locks[folder] = old
        raise FolderError(f"cannot move {folder} aside to {aside}: {e.strerror or e}; give this run another "
                          f"hydra.run.dir") from None
    old.run_dir, old.path = aside, aside / LOCK_NAME
    claim(folder)
    old.release()  # removes aside/.lock: what is left there is the old run as it was
    log.warning(f"existing_run=move_aside: moved what {folder} held ({what}) to {aside}")


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
    logs and the printed config tree (and the folders created for it, if now empty). A folder that existed empty
    before this run is emptied again, not removed (so the next try may use it); one that held anything is never
    touched. True if removed or emptied."""
    folder = Path(folder).absolute()
    top = _created.get(folder)
    if (top is None and folder not in _found_empty) or not folder.is_dir():
        return False
    for entry in folder.iterdir():
        if entry.name == ".hydra" and entry.is_dir():
            if any(p.name not in _HYDRA_FILES for p in entry.iterdir()):
                return False
        elif not (entry.is_file() and (entry.name == LOCK_NAME or entry.suffix == ".log")):
            return False
    release(folder)
    _created.pop(folder, None)
    if top is None:  # it existed, empty: empty it again
        _found_empty.discard(folder)
        for entry in folder.iterdir():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        return True
    shutil.rmtree(folder, ignore_errors=True)
    _remove_created(folder.parent, top if top != folder else None)
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
    """``resume=``: the folder must hold an intact checkpoint of this model, trained on these data; raises
    ResumeError (one line)."""
    value = config.get("resume")
    if value in (None, False, "", "null", "false"):
        return
    if config.get("ckpt_path"):
        raise resume.ResumeError("give either resume= or ckpt_path=, not both")
    if run_dir.is_dir():  # resume=auto's new folder does not exist yet
        check_no_links(run_dir, "run folder")  # Hydra writes .hydra/ and train.log there next, through any link
    here = resume.model_identity(config.get("model"))
    if str(value) == "auto" and not resume.has_checkpoint(run_dir):
        if not run_dir.exists():
            # the resolver found no run of this model under the runs folder (it returns a new folder then)
            _, skipped = resume.find_auto(run_dir.parent, here)
            other = ""
            if skipped is not None:
                there = resume.saved_model(skipped) or (None, None)
                other = (f"; skipped the newest run {skipped}, a run of another model ("
                         f"{'; '.join(resume.model_differences(there, here)[:3])})")
            raise resume.ResumeError(f"resume=auto: no run with {resume.LAST} under {run_dir.parent} of "
                                     f"{resume.describe(here)} with this model.net{other}; give the first part's "
                                     f"overrides")
        # the newest run of this model stopped before its first checkpoint: never silently an older one
        older, _ = resume.find_auto(run_dir.parent, here, with_checkpoint=True)
        way = (f"; to continue the older run {older}, give resume={older}" if older is not None and older != run_dir
               else "")
        raise resume.ResumeError(f"resume=auto: the newest run of {resume.describe(here)} with this model.net, "
                                 f"{run_dir}, has no {resume.LAST} (stopped before its first checkpoint): start it "
                                 f"anew with another hydra.run.dir{way}")
    if str(value) == "auto":
        order = resume.runs_newest_first(run_dir.parent)
        newer = [(r, m) for r in (order[:order.index(run_dir)] if run_dir in order else [])[:20]
                 for m in [resume.saved_model(r)] if m is not None and resume.model_differences(m, here)]
        _auto_skipped[run_dir] = ", ".join(f"{r.name} ({resume.describe(m)})" for r, m in newer[:3])
    from ..checkpoints.read import check_run_config  # (torch: only when resuming)
    from .load import for_training

    ckpt = resume.last_checkpoint(run_dir, value)
    saved = resume.saved_config(run_dir)  # read once: checked, compared, and kept for train.py's warnings
    check_run_config(saved, run_dir / resume.SAVED_CONFIG)  # names only attnlab's own code (a checkpoint is data)
    there = resume.model_identity(saved.get("model")) if saved is not None else None
    differences = resume.model_differences(there, here) if there is not None else []
    if differences:
        shown = "; ".join(differences[:3]) + ("; ..." if len(differences) > 3 else "")
        raise resume.ResumeError(f"resume={value}: {run_dir} is a run of another model ({shown}); give the first "
                                 f"part's overrides (see {run_dir / resume.SAVED_CONFIG})")
    differences = resume.data_differences(saved.get("data"), config.get("data")) if saved is not None else []
    if differences:
        shown = "; ".join(differences[:3]) + ("; ..." if len(differences) > 3 else "")
        raise resume.ResumeError(f"resume={value}: {run_dir} was trained on other data ({shown}): its checkpoint "
                                 f"holds the tokenizer and ids of those; give the first part's data overrides (see "
                                 f"{run_dir / resume.SAVED_CONFIG})")
    other = resume.optimizer_difference(saved, config) if saved is not None else None
    if other:
        raise resume.ResumeError(f"resume={value}: {run_dir} was trained with another optimizer ({other}): its checkpoint holds that "
                                 f"optimizer's state; give the first part's optim= (see {run_dir / resume.SAVED_CONFIG})")
    # the one read of the checkpoint: intact, data, of this model's family; the job's plan takes it from here
    _checkpoints[run_dir] = for_training(ckpt, config.get("model"), "resume")
    if saved is not None:
        _previous_configs[run_dir] = saved


def _run_dir(config: DictConfig) -> Path:
    """The single run's folder, ``hydra.run.dir`` resolved as Hydra will create it."""
    HydraConfig.instance().set_config(config)  # as run_job does before it resolves hydra.run.dir
    try:
        return Path(os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir"))))
    except OmegaConfBaseException as e:  # task_name=${oc.env:UNSET}: one line here, not Hydra's warning + traceback
        from .validate import interpolation_message

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

    from .validate import interpolation_problem, name_check

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
    from ..core.paths import CONF_DIR

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


def _resuming(config: DictConfig) -> bool:
    return config.get("resume") not in (None, False, "", "null", "false")


def _not_the_run_writer(config: DictConfig) -> None:
    """A process of another rank started by an outside launcher (torchrun on each node, SLURM) into the run folder
    rank 0 writes: it writes no ``.hydra/`` of its own and logs to ``rank<N>.log``, not into ``train.log`` (the DDP
    ranks Lightning starts are given the same by :func:`attnlab.runs.ddp.hydra_child_command`; a sweep's jobs by
    :func:`other_rank_job_overrides`)."""
    from omegaconf import open_dict, read_write

    rank = outside_rank()
    if rank is None or OmegaConf.select(config, "hydra.job.name") != "train":
        return  # a DDP child of Lightning's (named ddp_rank<N> already), or no outside launcher
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.output_subdir = None
        config.hydra.job.name = f"rank{rank}"


def other_rank_job_overrides() -> list[str]:
    """What :func:`_not_the_run_writer` does to a single run, as overrides for each job of a sweep that every node
    runs (torchrun ... train.py -m): a job's config is composed anew from its overrides. Empty on rank 0."""
    if launching_process() or (rank := outside_rank()) is None:
        return []
    return ["hydra.output_subdir=null", f"hydra.job.name=rank{rank}"]


class RunFolderGuard(Callback):
    @_never_swallowed
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not launching_process():
            _not_the_run_writer(config)
            return
        run_dir = _run_dir(config)
        check_resume(config, run_dir)
        move = not _resuming(config) and check_unused(run_dir, config)
        claim(run_dir)
        if move:
            _move_aside(run_dir)

    @_never_swallowed
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not launching_process():
            return
        HydraConfig.instance().set_config(config)
        sweep_dir = Path(os.path.abspath(str(OmegaConf.select(config, "hydra.sweep.dir"))))
        check_sweep_resume(config, sweep_dir)  # resume= names this sweep folder (the sweeper matches its jobs)
        move = not _resuming(config) and check_unused(sweep_dir, config, kind="sweep")
        claim(sweep_dir)
        if move:
            _move_aside(sweep_dir)

    @_never_swallowed
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not launching_process():
            return
        job_dir = Path(config.hydra.runtime.output_dir)
        if HydraConfig.get().mode == RunMode.MULTIRUN and _resuming(config):
            # a continued sweep's job (resume=<its folder>): checked as a single run's resume, before Hydra
            # overwrites its saved config
            check_resume(config, job_dir.absolute())
        claim(job_dir)  # a single run: already claimed in on_run_start; a sweep's job: its own folder

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        release(Path(config.hydra.runtime.output_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        _release_all()
