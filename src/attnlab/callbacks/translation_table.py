"""A table of a few fixed validation sentences and their translations, after every validation.

For a task with ``translation_table(size) -> list[TranslationRow]``
(:class:`~attnlab.tasks.protocols.TranslationTableSource`: every translation family); others are left alone. On
global rank zero, never for the sanity check, it writes

    ``<run dir>/translations/epoch{E:03d}-step{S:06d}.tsv``  (columns source, reference, hypothesis)

and logs the same rows as the W&B Table ``val/translations``. ``last_rows`` holds the rows of the last call.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L

from ..files.atomic import write_atomic
from ..tasks.protocols import TranslationRow, TranslationTableSource
from .media import run_dir, wandb_loggers, writes_now
from ..core.errors import at_least

COLUMNS = ["source", "reference", "hypothesis"]


class TranslationTableCallback(L.Callback):
    """Args:
        size: sentences in the table (spread over the length-sorted validation split); 0: no table.
        dirname: folder under the run dir.
    """

    def __init__(self, size: int = 8, dirname: str = "translations"):
        super().__init__()
        at_least("size", size, 0)
        self.size, self.dirname = size, dirname
        self.last_rows: list[TranslationRow] = []
        self.last_path: Path | None = None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.size == 0 or not writes_now(trainer) or not isinstance(pl_module, TranslationTableSource):
            return
        self.last_rows = rows = pl_module.translation_table(self.size)
        path = run_dir(trainer) / self.dirname / f"epoch{trainer.current_epoch:03d}-step{trainer.global_step:06d}.tsv"
        write_atomic(path, "\t".join(COLUMNS) + "\n" + "".join("\t".join(r) + "\n" for r in rows), durable=False)
        self.last_path = path
        for lg in wandb_loggers(trainer):
            lg.log_table(key="val/translations", columns=COLUMNS, data=[list(r) for r in rows],
                         step=trainer.global_step)
