"""Continue a sweep that was killed: the same ``python train.py -m ...`` command with ``resume=<sweep dir>`` (or
``resume=auto``: the newest sweep of this command).

A job is matched by its setting (its overrides without run bookkeeping, seed included:
:func:`attnlab.runs.sweep.job_setting`), never by its number, and keeps its number and folder:

- finished (``job_status.json`` says completed or failed): left as it is, byte for byte;
- stopped after its first checkpoint: continued in its folder from ``last.ckpt`` (``resume=<job dir>``, exact as a
  single run's resume);
- stopped before it (a folder, no checkpoint): its folder moved aside to ``<n>.old-<time>`` (nothing is deleted) and
  the job run anew under its number;
- never started: run, under the number the straight sweep gave it.

Every job a sweep plans is recorded before the first one starts, in ``<sweep dir>/sweep_plan.json`` (number and
overrides), so that a continuation knows the jobs that never got a folder. A command whose jobs differ from the
folder's is refused in one line naming the values that differ; ``extend_sweep=true`` accepts one that only adds jobs
(new settings get the next numbers, the old jobs are kept).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..core.errors import ResumeError, SweepJobError
from ..core.quoting import hydra_value
from ..files.atomic import write_atomic
from ..files.folder_paths import aside_name
from .resume import has_checkpoint
from .sweep import CONTINUATION_KEYS as OWN_KEYS, STATUS_FILE, job_setting, override_key

log = logging.getLogger(__name__)

PLAN_FILE = "sweep_plan.json"
MULTIRUN_FILE = "multirun.yaml"  # Hydra's record of the sweep's command (every sweeper writes it)
FINISHED = ("completed", "failed")  # job_status.json's statuses of a job that is not run again


def not_resuming(value: Any) -> bool:
    return value in (None, False, "", "null", "false")


def is_sweep_folder(path: Path) -> bool:
    return (path / MULTIRUN_FILE).is_file() or (path / PLAN_FILE).is_file()


@dataclass(frozen=True)
class Job:
    """One job of the sweep this command runs: its number, its overrides as the sweeper made them, and what to do."""

    num: int
    overrides: tuple[str, ...]
    action: str  # "new" | "resume" (from its last.ckpt) | "restart" (moved aside, run anew) | "finished"

    @property
    def setting(self) -> tuple[str, ...]:
        return job_setting(self.overrides)


def without_own_keys(overrides: Sequence[str]) -> list[str]:
    return [o for o in overrides if override_key(o) not in OWN_KEYS]


def launch_overrides(job: Job, sweep_dir: Path) -> list[str]:
    """The overrides a continued sweep launches ``job`` with: its own, its folder for ``resume=``, and the sweep's
    folder (``hydra.sweep.dir`` is otherwise recomposed per job from its own ``resume=``)."""
    extra = [f"hydra.sweep.dir={hydra_value(sweep_dir)}"]
    if job.action == "resume":
        extra.append(f"resume={hydra_value(sweep_dir / str(job.num))}")
    return [*job.overrides, *extra]


# ----------------------------------------------------------------------------------------------------------------
# what the folder holds
# ----------------------------------------------------------------------------------------------------------------
def recorded_jobs(sweep_dir: Path) -> dict[int, tuple[str, ...]]:
    """Number -> overrides of every job the folder's sweep planned: ``sweep_plan.json``, and the job folders'
    ``.hydra/overrides.yaml`` (a folder from before ``sweep_plan.json`` existed has only those)."""
    import yaml

    jobs: dict[int, tuple[str, ...]] = {}
    plan = sweep_dir / PLAN_FILE
    if plan.is_file():
        try:
            data = json.loads(plan.read_text(encoding="utf-8"))
            jobs = {int(j["num"]): tuple(str(o) for o in j["overrides"]) for j in data["jobs"]}
        except (ValueError, KeyError, TypeError) as e:
            raise SweepJobError(f"{plan}: not the sweep plan a train.py sweep writes ({type(e).__name__}: {e})") from None
    for folder in sweep_dir.iterdir():
        saved = folder / ".hydra" / "overrides.yaml"
        if folder.name.isdigit() and saved.is_file():
            try:
                overrides = yaml.safe_load(saved.read_text(encoding="utf-8")) or []
            except (yaml.YAMLError, UnicodeDecodeError) as e:
                raise SweepJobError(f"{saved}: not valid YAML ({type(e).__name__})") from None
            jobs.setdefault(int(folder.name), tuple(without_own_keys([str(o) for o in overrides])))
    return jobs


def job_state(job_dir: Path) -> str:
    """``finished``, ``resume`` (stopped, with a checkpoint), ``restart`` (stopped before one) or ``new``."""
    if not job_dir.exists():
        return "new"
    status = job_dir / STATUS_FILE
    if status.is_file():
        try:
            said = json.loads(status.read_text(encoding="utf-8")).get("status", "")
        except (ValueError, AttributeError, UnicodeDecodeError):
            said = ""  # a status half written by a killed job: the job did not finish
        if str(said).startswith(FINISHED):
            return "finished"
    return "resume" if has_checkpoint(job_dir) else "restart"


# ----------------------------------------------------------------------------------------------------------------
# the plan
# ----------------------------------------------------------------------------------------------------------------
def plan_jobs(sweep_dir: Path, jobs: Sequence[Sequence[str]], resume: Any, extend: bool) -> list[Job]:
    """The jobs to run, numbered: the straight sweep's ``0..n-1`` for a new sweep; for a continued one, each job
    under the number the folder gave its setting, and the action its state asks for. ResumeError (one line) for a
    command whose jobs are not the folder's."""
    jobs = [tuple(without_own_keys(j)) for j in jobs]
    if not_resuming(resume):
        return [Job(i, j, "new") for i, j in enumerate(jobs)]
    recorded = recorded_jobs(sweep_dir)
    by_setting = {job_setting(o): n for n, o in recorded.items()}
    here = {job_setting(j) for j in jobs}
    named = f"resume={resume}" + (f" ({sweep_dir})" if str(resume) == "auto" else "")
    dropped = [s for s in by_setting if s not in here]
    if dropped:
        raise ResumeError(f"{named}: this command is not the sweep there ({differences(by_setting, here)}); give "
                          f"the sweep's own overrides (see {sweep_dir / MULTIRUN_FILE}): a continued sweep keeps "
                          f"every job it has")
    added = [j for j in jobs if job_setting(j) not in by_setting]
    if added and not extend:
        raise ResumeError(f"{named}: this command adds {len(added)} job(s) to the sweep there "
                          f"({differences(by_setting, here)}); add extend_sweep=true to run them beside its "
                          f"{len(recorded)}, or give the sweep's own overrides (see {sweep_dir / MULTIRUN_FILE})")
    taken = set(recorded)
    out = []
    for i, j in enumerate(jobs):
        num = by_setting.get(job_setting(j))
        if num is None:  # a job never recorded: the straight sweep's number when free, else the next one
            num = i if i not in taken else max(taken) + 1
            taken.add(num)
        out.append(Job(num, j, job_state(sweep_dir / str(num))))
    return sorted(out, key=lambda job: job.num)


def differences(there: dict[tuple[str, ...], int], here: set[tuple[str, ...]]) -> str:
    """``norm=post there, not here; debug=fast there, not here``: the swept and fixed values that differ."""
    def values(settings) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for setting in settings:
            for o in setting:
                out.setdefault(override_key(o), set()).add(o.split("=", 1)[-1])
        return out

    a, b = values(there), values(here)
    parts = []
    for key in sorted(set(a) | set(b)):
        only_there, only_here = a.get(key, set()) - b.get(key, set()), b.get(key, set()) - a.get(key, set())
        parts += [f"{key}={v} there, not here" for v in sorted(only_there)]
        parts += [f"{key}={v} here, not there" for v in sorted(only_here)]
    if not parts:  # the same values in other combinations
        missing = [s for s in there if s not in here] or [s for s in here if s not in there]
        parts = [f"job {' '.join(missing[0]) or '(no overrides)'} is on one side only"]
    return "; ".join(parts[:4]) + ("; ..." if len(parts) > 4 else "")


def write_plan(sweep_dir: Path, jobs: Sequence[Job], recorded: dict[int, tuple[str, ...]] | None = None) -> None:
    """``sweep_plan.json``: every job the sweep folder has planned (what it held before and this command's)."""
    table = dict(recorded or {})
    table.update({j.num: j.overrides for j in jobs})
    text = json.dumps({"jobs": [{"num": n, "overrides": list(table[n])} for n in sorted(table)]}, indent=1)
    write_atomic(sweep_dir / PLAN_FILE, text)


def move_aside(job_dir: Path) -> Path:
    """A job stopped before its first checkpoint is run anew: what its folder holds goes to ``<n>.old-<time>``."""
    aside = aside_name(job_dir)
    job_dir.rename(aside)
    log.info(f"job {job_dir.name} stopped before its first checkpoint: run anew, its folder moved to {aside}")
    return aside


# ----------------------------------------------------------------------------------------------------------------
# resume=auto and the folder hydra.sweep.dir names (conf/hydra/default.yaml)
# ----------------------------------------------------------------------------------------------------------------
def command_jobs(root: DictConfig | None) -> list[tuple[str, ...]]:
    """The settings of the jobs the command line sweeps (Hydra's basic expansion of ``hydra.overrides.task``)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    node = OmegaConf.select(root, "hydra.overrides.task", default=None) if isinstance(root, DictConfig) else None
    if node is None:
        return []
    typed = without_own_keys([str(o) for o in OmegaConf.to_container(node, resolve=False)])
    (jobs,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(typed), None)
    return [job_setting(j) for j in jobs]


def newest_sweep_of(multiruns: Path, settings: list[tuple[str, ...]], extend: bool) -> Path | None:
    """The newest sweep folder under ``multiruns`` whose jobs are this command's (with ``extend``: all among
    them); None if there is none."""
    if not multiruns.is_dir():
        return None
    here = set(settings)

    def written(p: Path) -> float:
        return max((f.stat().st_mtime for f in (p / PLAN_FILE, p / MULTIRUN_FILE) if f.is_file()), default=0.0)

    for sweep in sorted((p for p in multiruns.iterdir() if p.is_dir() and is_sweep_folder(p)),
                        key=lambda p: (written(p), p.name), reverse=True):
        try:
            there = {job_setting(o) for o in recorded_jobs(sweep).values()}
        except (SweepJobError, OSError):
            continue
        if there and (there == here or (extend and there <= here)):
            return sweep
    return None


def resolve_sweep_dir(resume: Any, multiruns: str, stamp: str, _root_: DictConfig | None = None) -> str:
    """``hydra.sweep.dir``: ``multiruns/stamp`` for a new sweep; the sweep folder ``resume=`` names (``auto``: the
    newest of this command). Never raises: where there is nothing to continue it returns the new folder, and the
    run folder guard refuses in one line before anything is written."""
    if not_resuming(resume):
        return str(Path(multiruns) / stamp)
    if str(resume) == "auto":
        extend = bool(OmegaConf.select(_root_, "extend_sweep", default=False)) if _root_ is not None else False
        try:
            found = newest_sweep_of(Path(multiruns), command_jobs(_root_), extend)
        except Exception:  # noqa: BLE001 - a command line Hydra itself refuses next, in its own words
            found = None
        return str(found) if found is not None else str(Path(multiruns) / stamp)
    path = Path(os.path.abspath(Path(str(resume)).expanduser()))
    return str(path) if is_sweep_folder(path) else str(Path(multiruns) / stamp)


def check_sweep_resume(config: DictConfig, sweep_dir: Path) -> None:
    """Before anything is written: ``resume=`` in a sweep names a sweep folder (not a run), the one
    ``hydra.sweep.dir`` names if both are given; ResumeError (one line) otherwise."""
    value = config.get("resume")
    if not_resuming(value):
        if config.get("extend_sweep"):
            raise ResumeError("extend_sweep=true adds jobs to a sweep being continued: give resume=<sweep dir> too")
        return
    if str(value) == "auto":
        if not is_sweep_folder(sweep_dir):
            raise ResumeError(f"resume=auto: no sweep of this command under {sweep_dir.parent} (a sweep folder "
                              f"whose jobs are this command's); give resume=<sweep dir>")
        return
    named = Path(os.path.abspath(Path(str(value)).expanduser()))
    if named.resolve() != sweep_dir.resolve():
        if is_sweep_folder(named):
            raise ResumeError(f"resume={value} and hydra.sweep.dir={sweep_dir} name two sweep folders; give one")
        if (named / ".hydra").is_dir() or (named / "checkpoints").is_dir():
            raise ResumeError(f"resume={value} is a run folder, not a sweep folder: continue it without -m "
                              f"(python train.py <its overrides> resume={value})")
        what = "no such folder" if not named.exists() else f"no {MULTIRUN_FILE} there"
        raise ResumeError(f"resume={value}: not a sweep folder ({what}); give the folder of a `train.py -m` sweep")


OmegaConf.register_new_resolver("resume_sweep_dir", resolve_sweep_dir, replace=True)
