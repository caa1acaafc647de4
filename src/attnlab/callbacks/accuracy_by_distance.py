"""The sequence classifier's test accuracy per distance, as a JSON file for claim E7's analysis.

For a task with ``distance_record() -> dict | None`` (:class:`~attnlab.tasks.protocols.DistanceRecordSource`: the
sequence classifier on data with distances, e.g. needle recall); others are left alone. After testing, on global
rank zero, it writes ``<run dir>/test_by_distance.json`` (one line: the encoder, its size, receptive field and
sequential steps, and correct/total per distance). ``path`` is the file written.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L

from ..files.atomic import write_atomic
from ..tasks.protocols import DistanceRecordSource
from .media import run_dir


class AccuracyByDistanceCallback(L.Callback):
    def __init__(self, filename: str = "test_by_distance.json"):
        super().__init__()
        self.filename = filename
        self.path: Path | None = None

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or not isinstance(pl_module, DistanceRecordSource):
            return
        record = pl_module.distance_record()
        if record is None:
            return
        self.path = run_dir(trainer) / self.filename
        write_atomic(self.path, json.dumps(record) + "\n", durable=False)
