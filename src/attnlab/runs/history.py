"""A run's logged metrics, step by step, read back from its run directory without any network.

train.py logs to W&B offline by default (``<run>/wandb/offline-run-*/run-<id>.wandb``, a binary protobuf log) and,
with ``logger=csv``, to ``<run>/csv/version_*/metrics.csv``. The notebooks draw curves from either:

* the CSV files, read directly;
* the W&B log, through ``wandb leet inspect --json`` (W&B's own reader of ``.wandb`` files, a local command in
  wandb 0.31, the release this was tested with: one JSON object per record, no account, no network, no upload).
  A wandb without that command cannot read the log locally; the history then stays unread, ``metrics.json``
  (final values) is what is left, and ``wandb sync`` uploads the run to view its curves online.

Each row is ``{"step": <trainer global step>, "<metric>": <float>, ...}``; only numbers are kept (images and tables
logged to W&B are skipped).
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import RunHistoryError, one_line_message
from ..core.quoting import shell_path


@dataclass
class History:
    """``rows`` in logging order; ``source`` says where they came from (a path), or why there are none."""

    rows: list[dict[str, float]] = field(default_factory=list)
    source: str = ""

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, in logging order."""
        pts = [(int(r["step"]), r[key]) for r in self.rows if key in r and "step" in r]
        return [s for s, _ in pts], [v for _, v in pts]

    def keys(self) -> set[str]:
        return {k for r in self.rows for k in r} - {"step"}


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _version(path: Path) -> int:
    m = re.search(r"version_(\d+)", str(path))
    return int(m.group(1)) if m else -1


def read_csv_history(run_dir: Path) -> History:
    """Every ``csv/version_*/metrics.csv`` of the run in version order (a resumed run adds a version)."""
    files = sorted(Path(run_dir).glob("csv/version_*/metrics.csv"), key=_version)
    rows = []
    for path in files:
        try:
            with open(path, newline="", encoding="utf-8") as f:
                for raw in csv.DictReader(f):
                    row = {k: v for k, v in ((k, _number(v)) for k, v in raw.items() if v not in (None, "") and k)
                           if v is not None}
                    if len(row) > 1 and "step" in row:
                        rows.append(row)
        except (UnicodeDecodeError, csv.Error) as e:  # a damaged file: one line naming it, not a traceback
            raise RunHistoryError(f"{path}: not a readable CSV of metrics ({one_line_message(e)})") from None
    return History(rows, ", ".join(str(p) for p in files))


def wandb_offline_runs(run_dir: Path) -> list[Path]:
    """The run's ``.wandb`` logs, oldest first (``resume=`` continues the same W&B id in a new offline folder)."""
    return sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"), key=lambda p: p.parent.name)


def read_wandb_file(path: Path, timeout: float = 120) -> list[dict[str, float]]:
    """The history rows of one offline ``.wandb`` file, through ``wandb leet inspect --json`` (local, no network).
    Raises ``RuntimeError`` with the command's message when this wandb cannot read it (no ``leet`` command)."""
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise RuntimeError(f"`wandb leet inspect` could not read {path}: {why[-1] if why else proc.returncode}")
    rows = []
    for line in proc.stdout.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("type") != "history":
            continue
        item = record.get("history", {}).get("item", {})
        # an image or table is stored as `<key>._type`, `<key>.width`, ...: none of those is a metric
        media = tuple(k[: -len("_type")] for k in item if k.endswith("._type"))
        row = {k: v for k, v in ((k, _number(v)) for k, v in item.items()
                                 if not k.startswith("_") and not k.startswith(media or ("\0",))) if v is not None}
        # Lightning logs its own step; W&B's `_step` counts log calls (images and tables included)
        step = row.pop("trainer/global_step", None)
        if step is None:
            step = _number(item.get("_step"))
        if row and step is not None:
            rows.append({"step": int(step), **row})
    return rows


def read_wandb_history(run_dir: Path) -> History:
    runs = wandb_offline_runs(run_dir)
    if not runs:
        return History([], "no wandb/offline-run-*/run-*.wandb in the run directory")
    rows: list[dict[str, float]] = []
    try:
        for path in runs:
            rows += read_wandb_file(path)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return History([], f"{e}; `wandb sync {shell_path(runs[-1].parent)}` uploads it to view online")
    return History(rows, ", ".join(str(p) for p in runs))


def read_history(run_dir: str | Path) -> History:
    """The CSV logger's rows if the run has them (exact, every logged value), else the W&B offline log's."""
    run_dir = Path(run_dir)
    csv_history = read_csv_history(run_dir)
    if csv_history.rows:
        return csv_history
    wandb_history = read_wandb_history(run_dir)
    if wandb_history.rows:
        return wandb_history
    return History([], f"no CSV metrics ({run_dir}/csv/version_*/metrics.csv) and no readable W&B history "
                       f"({wandb_history.source})")


def final_metrics(run_dir: str | Path) -> dict[str, float]:
    """``metrics.json``: the final values train.py writes after fit and test ({} if the run did not finish)."""
    path = Path(run_dir) / "metrics.json"
    return json.loads(path.read_text()) if path.is_file() else {}
