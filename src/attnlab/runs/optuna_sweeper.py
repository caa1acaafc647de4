"""A Hydra sweeper on today's Optuna (ask and tell): ``python train.py -m hparams_search=lm_optuna``.

Each trial is one job of the sweep folder, numbered as the trial. The study lives in the sweep folder
(``sqlite:///<sweep dir>/optuna.db`` unless ``storage`` names another), so that:

- a killed search continues where it stopped: the same command with ``resume=<sweep dir>``; finished trials are
  kept, a trial the kill interrupted is run again under its number with its parameters (from its ``last.ckpt`` when
  it has one, exactly), then new trials are asked until ``n_trials``;
- the same sampler seed gives the same trials, straight or continued: trial ``n`` is drawn by a sampler seeded
  ``seed + n`` from the trials before it;
- a ``pruner`` stops a trial whose validation metric, reported each epoch by the trial's job
  (:class:`attnlab.callbacks.optuna_pruning.OptunaPruning`), is behind the others' at the same epoch; its job ends
  "pruned", which the summary counts with the epochs it saved;
- ``optimized_metric: [val/loss, perf/step_time_ms]`` with ``direction: [minimize, minimize]`` searches several
  objectives; the summary lists the Pareto front (pruning needs one objective);
- ``optuna-dashboard sqlite:///<sweep dir>/optuna.db`` shows the study.

The search space (``params``) is written as Hydra sweeps (:mod:`attnlab.runs.search_space`).
"""

from __future__ import annotations

import json
import logging
import os
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..core.errors import ConfigError, ResumeError, UserError
from ..core.quoting import hydra_value
from ..files.atomic import write_atomic
from . import search_space, sweep_continue as cont
from .sweep import STATUS_FILE

log = logging.getLogger(__name__)

STUDY_FILE = "optuna.db"
REPORT_FILE = "optuna_study.md"
SEARCH_ATTR = "attnlab_search"  # the study's user attribute: the search a continuation must repeat


class OptunaSweeper:
    """The sweeper's work; :class:`hydra_plugins.attnlab.OptunaSweeper` is the Hydra plugin around it."""

    def __init__(self, sampler: Any = None, pruner: Any = None, direction: Any = "minimize",
                 study_name: str | None = None, storage: str | None = None, n_trials: int = 20, n_jobs: int = 1,
                 params: Any = None) -> None:
        self.sampler_cfg, self.pruner_cfg = sampler, pruner
        self.direction, self.study_name, self.storage = direction, study_name, storage
        self.n_trials, self.n_jobs, self.params = n_trials, n_jobs, params
        self.config: DictConfig | None = None
        self.launcher = None
        self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    # ------------------------------------------------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> Any:
        try:
            return self._sweep(arguments)
        except UserError as e:
            from .folder import _refuse, discard_if_unused

            discard_if_unused(Path(str(self.config.hydra.sweep.dir)))  # a refused sweep leaves no folder
            _refuse(e)

    def _sweep(self, arguments: list[str]) -> Any:
        import optuna
        from optuna.trial import TrialState

        assert self.config is not None and self.launcher is not None
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and "TORCHELASTIC_RUN_ID" in os.environ:
            # every node would ask the study for trials of its own (the basic sweep's nodes follow one plan)
            raise ConfigError("an Optuna search runs on one node (a trial may use all of its devices): start it "
                              "without torchrun")
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        resume = self.config.get("resume")
        continuing = not cont.not_resuming(resume)
        metrics, directions = self._objectives()
        space, fixed = search_space.parse(_plain(self.params), cont.without_own_keys(arguments))
        if not space:
            raise ConfigError("hparams_search: the search space is empty (give hydra.sweeper.params or a sweep such as "
                              "model.optimizer.lr=interval(1e-4,1e-2))")
        pruner = self._instantiate(self.pruner_cfg, "pruner")
        if pruner is not None and len(directions) > 1:
            raise ConfigError(f"hydra.sweeper.pruner: Optuna prunes a search of one objective; this one has "
                              f"{len(directions)} ({', '.join(metrics)}): set hydra.sweeper.pruner=null")
        if not isinstance(self.n_trials, int) or self.n_trials < 1 or not isinstance(self.n_jobs, int) or self.n_jobs < 1:
            raise ConfigError(f"hydra.sweeper: n_trials={self.n_trials} and n_jobs={self.n_jobs} must be whole numbers "
                              f"of at least 1")
        if (check := getattr(self.launcher, "check_jobs", None)) is not None:  # launcher=local/slurm, before any
            check([list(fixed)])  # folder (the trials' sampled values are checked as they are launched)
        storage = self.storage or f"sqlite:///{sweep_dir / STUDY_FILE}"
        name = self.study_name or "attnlab"
        search = {"space": {k: repr(v) for k, v in space.items()}, "fixed": sorted(fixed), "metrics": metrics,
                  "directions": directions}
        sweep_dir.mkdir(parents=True, exist_ok=True)
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # each trial's line is ours (with its job folder)
        study = self._study(optuna, name, storage, directions, pruner, search, continuing, resume, sweep_dir)
        OmegaConf.save(self.config, sweep_dir / cont.MULTIRUN_FILE)

        returns = []
        # trials a killed search left running: run again under their numbers, with their parameters
        stale = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
        if continuing:
            done = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
            log.info(f"continuing the search {sweep_dir}: {done} trial(s) finished, {len(stale)} to run again, "
                     f"{max(0, self.n_trials - done - len(stale))} new")
        while True:
            trials = study.get_trials(deepcopy=False)
            budget = self.n_trials - sum(t.state.is_finished() for t in trials)
            if budget <= 0:
                break
            batch = [(t, self._rerun(sweep_dir, t)) for t in stale[: self.n_jobs]]
            stale = stale[len(batch):]
            while len(batch) < min(self.n_jobs, budget) and not stale:
                batch.append((self._ask(study, space), "new"))
            returns.append(self._run(study, batch, fixed, sweep_dir, storage, name, metrics, directions))
        self._report(study, sweep_dir, metrics, directions)
        return returns

    # ------------------------------------------------------------------------------------------------------------
    def _objectives(self) -> tuple[list[str], list[str]]:
        raw = self.config.get("optimized_metric")
        metrics = [str(m) for m in (list(raw) if isinstance(raw, (list, tuple)) or OmegaConf.is_list(raw) else [raw])
                   if m]
        if not metrics:
            raise ConfigError("hparams_search needs optimized_metric: the metric (or list of metrics) to optimize")
        raw_dir = self.direction
        directions = [str(d) for d in (list(raw_dir) if OmegaConf.is_list(raw_dir) or isinstance(raw_dir, (list, tuple))
                                       else [raw_dir] * len(metrics))]
        if len(directions) != len(metrics) or any(d not in ("minimize", "maximize") for d in directions):
            raise ConfigError(f"hydra.sweeper.direction={list(directions)}: give minimize or maximize for each of "
                              f"optimized_metric={metrics}")
        return metrics, directions

    def _instantiate(self, cfg: Any, what: str, **kw):
        if cfg is None:
            return None
        from hydra.utils import instantiate

        try:
            return instantiate(cfg, **kw)
        except Exception as e:  # noqa: BLE001 - a sampler or pruner class or argument that does not exist
            cause = e.__cause__ or e
            raise ConfigError(f"hydra.sweeper.{what}: {type(cause).__name__}: {str(cause).splitlines()[0]}") from None

    def _sampler(self, number: int):
        """Trial ``number``'s sampler: the configured one, seeded ``seed + number`` (so that a continued search
        draws what the straight one did); unseeded samplers are used as configured."""
        cfg = self.sampler_cfg
        if cfg is None:
            import optuna

            return optuna.samplers.TPESampler(seed=number)
        seed = cfg.get("seed") if hasattr(cfg, "get") else None
        return self._instantiate(cfg, "sampler", **({"seed": int(seed) + number} if seed is not None else {}))

    def _study(self, optuna, name, storage, directions, pruner, search, continuing, resume, sweep_dir):
        kept = None
        try:
            kept = optuna.load_study(study_name=name, storage=storage) if continuing else None
        except KeyError:  # no study of that name in the storage
            kept = None
        except Exception as e:  # noqa: BLE001 - a storage URL Optuna cannot open
            raise ConfigError(f"hydra.sweeper.storage={storage}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        if continuing and kept is None:
            raise ResumeError(f"resume={resume}: no Optuna study {name!r} in {storage} to continue")
        if kept is not None:
            before = kept.user_attrs.get(SEARCH_ATTR)
            if before is not None and before != search:
                changed = [k for k in search if before.get(k) != search[k]]
                detail = "; ".join(f"{k}: {before.get(k)} there, {search[k]} here" for k in changed)
                raise ResumeError(f"resume={resume}: this search is not the one in {sweep_dir} ({detail[:300]}); give "
                                  f"its own hparams_search and overrides (n_trials may grow)")
        try:
            study = optuna.create_study(study_name=name, storage=storage, directions=directions, pruner=pruner,
                                        load_if_exists=continuing, sampler=self._sampler(0))
        except optuna.exceptions.DuplicatedStudyError:
            raise ResumeError(f"hydra.sweeper.storage={storage} already holds a study {name!r}: continue it with "
                              f"resume={sweep_dir}, or give another study_name") from None
        if kept is None:
            study.set_user_attr(SEARCH_ATTR, search)
        return study

    def _ask(self, study, space):
        number = len(study.get_trials(deepcopy=False))
        study.sampler = self._sampler(number)
        return study.ask(space)

    @staticmethod
    def _rerun(sweep_dir: Path, trial) -> str:
        state = cont.job_state(sweep_dir / str(trial.number))
        if state == "restart":
            cont.move_aside(sweep_dir / str(trial.number))
            return "new"
        return state  # "finished" (killed before its result was told), "resume", or "new"

    def _run(self, study, batch, fixed, sweep_dir, storage, name, metrics, directions):
        from ..runs.sweeper import _batches

        jobs = [cont.Job(t.number, tuple(fixed) + tuple(search_space.override(k, v) for k, v in t.params.items())
                         + (f"trial.study={hydra_value(name)}", f"trial.storage={hydra_value(storage)}",
                            f"trial.id={t._trial_id}"), action) for t, action in batch]
        by_number = {t.number: t for t, _ in batch}
        results = []
        todo = [j for j in jobs if j.action != "finished"]
        for run in _batches(todo, None):
            overrides = [cont.launch_overrides(j, sweep_dir) for j in run]
            results += list(self.launcher.launch(overrides, initial_job_idx=run[0].num))
        for job in jobs:
            self._tell(study, by_number[job.num], sweep_dir / str(job.num), metrics, directions)
        return results

    @staticmethod
    def _tell(study, trial, job_dir: Path, metrics, directions) -> None:
        """Tell the study how the trial's job ended, as its ``job_status.json`` says (any launcher writes it)."""
        from optuna.trial import TrialState

        try:
            status = json.loads((job_dir / STATUS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            status = {}
        value = status.get("value")
        if status.get("status") == "pruned":
            study.tell(trial.number, state=TrialState.PRUNED)
            return
        values = value if isinstance(value, list) else [value]
        if (status.get("status") == "completed" and len(values) == len(metrics)
                and all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)):
            study.tell(trial.number, values if len(values) > 1 else values[0])
            log.info(f"trial {trial.number}: {', '.join(f'{m}={v:.4g}' for m, v in zip(metrics, values))}")
        else:
            study.tell(trial.number, state=TrialState.FAIL)
            log.warning(f"trial {trial.number} failed: {status.get('error') or status.get('status') or 'no result'}")

    def _report(self, study, sweep_dir: Path, metrics: Sequence[str], directions: Sequence[str]) -> None:
        write_atomic(sweep_dir / REPORT_FILE, study_report(study, sweep_dir, metrics, directions), durable=False)


def _plain(node: Any) -> dict | None:
    if node is None:
        return None
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


def study_report(study, sweep_dir: Path, metrics: Sequence[str], directions: Sequence[str]) -> str:
    """The study's section of ``sweep_summary.md``: its trials, the best (or the Pareto front), and what pruning
    saved (the epochs pruned trials did not train, from their jobs' ``job_status.json``)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    lines = [f"Optuna study {study.study_name}: {len(trials)} trial(s), "
             + ", ".join(f"{sum(t.state == s for t in trials)} {s.name.lower()}" for s in
                         (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) if any(t.state == s for t in trials))]
    if len(metrics) == 1 and any(t.state == TrialState.COMPLETE for t in trials):
        best = study.best_trial
        lines.append(f"best: trial {best.number}, {metrics[0]} = {best.value:.4f} ({_params(best)})")
    elif any(t.state == TrialState.COMPLETE for t in trials):
        front = sorted(study.best_trials, key=lambda t: t.number)
        lines.append(f"Pareto front ({', '.join(f'{m} ({d})' for m, d in zip(metrics, directions))}): "
                     + "; ".join(f"trial {t.number} = {', '.join(f'{v:.4g}' for v in t.values)}" for t in front))
    trained = saved = 0  # epochs: every trial's reported ones (one report per validated epoch), and the pruned ones'
    for t in trials:
        try:
            status = json.loads((sweep_dir / str(t.number) / STATUS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            status = {}
        if isinstance(status.get("epochs"), int) and isinstance(status.get("max_epochs"), int):
            trained += status["epochs"]
            saved += status["max_epochs"] - status["epochs"]
        else:
            trained += len(t.intermediate_values)
    if saved:
        lines.append(f"pruning: the pruned trials stopped {saved} epoch(s) early; the search trained {trained} of "
                     f"{trained + saved} epochs ({saved / (trained + saved):.0%} saved)")
    lines.append(f"view it: optuna-dashboard {_storage_of(study)}")
    return "\n".join(lines) + "\n"


def _params(trial) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())


def _storage_of(study) -> str:
    url = getattr(getattr(study, "_storage", None), "url", None)
    if url is None:  # optuna wraps RDB storage in a cache
        url = getattr(getattr(getattr(study, "_storage", None), "_backend", None), "url", "<storage URL>")
    return str(url)
