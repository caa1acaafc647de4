"""The offline W&B runs of a run or sweep folder, as W&B itself reads them.

A run logged with ``logger=wandb`` (offline, the default) lands in ``<run dir>/wandb/offline-run-*/`` as a
``run-<id>.wandb`` transaction log: protobuf records, no JSON summary next to it. ``wandb leet inspect --summary
--json <run dir>`` (W&B's terminal viewer, wandb >= 0.31; no network, no account) reads that log and prints one
JSON object: the run's id, project, tags, its config as logged (this project logs it flattened: ``model.net.d_model``
is one key) and its summary, which holds every key the run ever logged (its last value; media as
``{"_type": "images/separated", ...}``). :func:`read_offline_runs` runs it once per run, in parallel, so that what
the workspace names is what the runs actually logged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import WandbRunError

LEET_TIMEOUT_S = 120  # one run's log: well under a second of wandb-core; generous for a busy machine



def media_kind(summary_value: Any) -> str | None:
    """``image`` | ``table`` | ``audio`` | ``html`` for a summary entry of logged media, else None: attention maps,
    confusion matrices, TTS mels and alignments are images (``images/separated``, one image: ``image-file``), the
    translation table a ``table-file``, the TTS samples audio, the attention explorer an ``html-file``."""
    kind = summary_value.get("_type", "") if isinstance(summary_value, dict) else ""
    if kind.startswith("image"):
        return "image"
    if kind == "table-file":
        return "table"
    if kind.startswith("audio"):
        return "audio"
    if kind == "html-file":
        return "html"
    return None


@dataclass
class OfflineRun:
    path: Path  # the offline-run-* folder
    run_id: str
    project: str
    entity: str
    name: str
    tags: list[str]
    config: dict[str, Any]
    summary: dict[str, Any]

    def scalar_keys(self) -> set[str]:
        """Numeric keys this run logged (W&B's own ``_step``/``_runtime``/``_timestamp`` left out)."""
        return {k for k, v in self.summary.items()
                if not k.startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool)}

    def media_keys(self) -> dict[str, str]:
        """Media keys this run logged -> ``image`` | ``table`` | ``audio`` | ``html``."""
        return {k: kind for k, v in self.summary.items() if (kind := media_kind(v))}


def offline_run_dirs(run_dir: Path) -> list[Path]:
    """The offline W&B runs under ``<run_dir>/wandb`` (a resumed run has one folder per part), oldest first."""
    return sorted(p for p in (Path(run_dir) / "wandb").glob("offline-run-*") if p.is_dir())


def leet_command(path: Path) -> list[str]:
    """This interpreter's wandb (the one attnlab logs with), as runs/history.py runs it."""
    return [sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(path)]


def read_offline_runs(paths: list[Path]) -> list[OfflineRun]:
    """Read every offline run folder in ``paths`` with ``wandb leet inspect --summary --json``, in parallel."""
    procs = [(p, subprocess.Popen(leet_command(p), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)) for p in paths]
    runs = []
    for path, proc in procs:
        try:
            out, err = proc.communicate(timeout=LEET_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise WandbRunError(f"`wandb leet inspect --summary --json {path}` did not finish in {LEET_TIMEOUT_S} s")
        if proc.returncode != 0:
            why = (err.strip().splitlines() or ["no output"])[-1]
            raise WandbRunError(f"`wandb leet inspect --summary --json {path}` failed ({why}); it needs wandb>=0.31")
        try:
            d = json.loads(out)
        except json.JSONDecodeError:
            raise WandbRunError(f"`wandb leet inspect --summary --json {path}` printed no JSON; it needs wandb>=0.31")
        runs.append(OfflineRun(path=path, run_id=d.get("run_id") or "", project=d.get("project") or "",
                               entity=d.get("entity") or "", name=d.get("name") or "", tags=list(d.get("tags") or []),
                               config=dict(d.get("config") or {}), summary=dict(d.get("summary") or {})))
    return runs
