"""The jobs of a Hydra sweep folder, read back from disk: what each was told (overrides, group choices, config), its
seed, how it ended, and what it logged (``metrics.json``, the CSV or offline W&B history).

``python train.py -m ...`` writes one numbered folder per job under the sweep folder (conf/hydra/default.yaml):
``<job>/.hydra/{overrides,hydra,config}.yaml`` from Hydra, ``<job>/metrics.json`` (final values) from train.py,
``<job>/job_status.json`` (how it ended) from the sweep callback, and the loggers' files. Shared by
:mod:`attnlab.cli.compare`, the review notebooks and the claims (``experiments/claims/base.py``).
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from ..core.errors import SweepJobError, one_line_message
from .history import History, read_history
from .sweep import SEED_KEY, STATUS_FILE


def _load(path: Path, what: str, parse, kind: type):
    """``parse(text)`` of ``path``, which must give a ``kind``; a SweepJobError naming the file otherwise."""
    try:
        value = parse(path.read_text(encoding="utf-8"))
    except Exception as e:  # YAML, JSON or UTF-8 errors of a damaged file
        raise SweepJobError(f"{path}: not valid {what} ({one_line_message(e)})") from None
    if not isinstance(value, kind):
        raise SweepJobError(f"{path}: holds a {type(value).__name__}, not the {what} a train.py job writes")
    return value


class SweepJob:
    """One Hydra job (a run directory) of a sweep."""

    def __init__(self, path: str | Path):
        self.dir = Path(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dir}, {self.overrides})"

    @property
    def name(self) -> str:
        return self.dir.name

    @cached_property
    def override_list(self) -> list[str]:
        """The command-line overrides of this job as Hydra saved them, ``['norm=rms', 'seed=1']``."""
        import yaml

        path = self.dir / ".hydra" / "overrides.yaml"
        if not path.is_file():
            return []
        return [str(o) for o in _load(path, "YAML list of overrides", lambda t: yaml.safe_load(t) or [], list)]

    @cached_property
    def overrides(self) -> dict[str, str]:
        """The command-line overrides of this job, ``{'norm': 'rms', 'model.net.pool': 'cls'}``."""
        return dict(item.lstrip("+~").split("=", 1) for item in self.override_list if "=" in item)

    @cached_property
    def choices(self) -> dict[str, str]:
        """The option of each config group this job ran with, ``{'pos': 'learned', 'norm': 'pre', ...}`` (Hydra's
        runtime choices: group options are parts, whose config has no name of its own)."""
        from omegaconf import DictConfig, OmegaConf

        path = self.dir / ".hydra" / "hydra.yaml"
        if not path.is_file():
            return {}
        hydra = _load(path, "Hydra YAML", OmegaConf.create, DictConfig)
        choices = OmegaConf.select(hydra, "hydra.runtime.choices", default=None)
        if not isinstance(choices, DictConfig):
            raise SweepJobError(f"{path}: has no hydra.runtime.choices (not the hydra.yaml a train.py job writes)")
        return {str(k): str(v) for k, v in choices.items() if v is not None}

    @cached_property
    def config(self):
        from omegaconf import DictConfig, OmegaConf

        from ..checkpoints.allowed_targets import check_targets
        from ..checkpoints.upgrade import upgrade_targets

        path = self.dir / ".hydra" / "config.yaml"
        if not path.is_file():
            return OmegaConf.create({})
        config = upgrade_targets(_load(path, "YAML config", OmegaConf.create, DictConfig))
        check_targets(config, str(path), scope="run")  # the claims build data and models from it: data, not code
        return config

    def value(self, key: str) -> str | None:
        """What this job ran with for ``key``: its override, else its config group's option (``norm``), else the
        config value (``model.net.d_model``); None if the job has none of those."""
        from omegaconf import OmegaConf

        if key in self.overrides:
            return self.overrides[key]
        if key in self.choices:
            return self.choices[key]
        found = OmegaConf.select(self.config, key, default=None, throw_on_missing=False)
        return None if found is None else str(found)

    @property
    def seed(self) -> int | None:
        value = self.value(SEED_KEY)
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    @cached_property
    def status(self) -> dict[str, Any]:
        """``job_status.json`` (``{"status": "completed"|"failed", "error": ...}``), {} if the job wrote none."""
        path = self.dir / STATUS_FILE
        return _load(path, "JSON object", json.loads, dict) if path.is_file() else {}

    @property
    def finished(self) -> bool:
        return (self.dir / "metrics.json").is_file()

    def why_unfinished(self) -> str:
        return self.status.get("error") or ("no job_status.json" if not self.status else self.status.get("status", "?"))

    @cached_property
    def final(self) -> dict[str, float]:
        """The final metrics from ``metrics.json`` ({} if the job did not finish)."""
        path = self.dir / "metrics.json"
        return _load(path, "JSON object of metrics", json.loads, dict) if path.is_file() else {}

    @cached_property
    def history(self) -> History:
        """Every logged value, step by step (CSV logger, else the offline W&B log)."""
        return read_history(self.dir)

    def final_value(self, key: str) -> float | None:
        """The metric's final value: ``metrics.json``'s, else the last logged value; None if the job has neither."""
        if key in self.final:
            value = self.final[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):  # NaN/Infinity parse as floats
                raise SweepJobError(f"{self.dir / 'metrics.json'}: {key} is {json.dumps(value)}, not a number")
            return float(value)
        _, values = self.history.series(key)
        return float(values[-1]) if values else None


def sweep_job_dirs(sweep_dir: str | Path) -> list[Path]:
    """The job folders of one multirun folder in job order (0, 1, …, 10), or the folder itself if it is a single
    run; FileNotFoundError (one line) when there is none."""
    sweep_dir = Path(sweep_dir)
    if (sweep_dir / ".hydra").is_dir():
        return [sweep_dir]
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir} is a file, not a sweep or run folder")
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir}: no such directory")
    subdirs = [p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    if not subdirs:
        raise FileNotFoundError(f"no runs under {sweep_dir} (expected the numbered job folders of a "
                                "`python train.py -m ...` sweep)")
    return sorted(subdirs, key=lambda p: int(p.name))


def sweep_jobs(sweep_dir: str | Path, job_class: type[SweepJob] = SweepJob) -> list[SweepJob]:
    return [job_class(p) for p in sweep_job_dirs(sweep_dir)]
