"""The confusion matrix of every validation and of the test, drawn.

For a task with ``confusion_result(stage) -> ConfusionResult | None``
(:class:`~attnlab.tasks.protocols.ConfusionSource`: the image classifier, whose ``model.confusion_matrix``
turns the tracking on or off); others are left alone. The task reduces the matrix over every rank in its own epoch
end; this callback draws it afterwards (``on_validation_end``, ``on_test_end``), on global rank zero, never for the
sanity check, into ``<run dir>/confusion_matrix/epochNNN.png`` (validation) and ``test.png``, and logs it to W&B as
``confusion_matrix/val`` and ``confusion_matrix/test``. ``paths`` lists every file written.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L

from ..tasks.protocols import ConfusionSource
from ..plots.figures import save_figure
from .media import log_image, run_dir, writes_now


class ConfusionMatrixCallback(L.Callback):
    def __init__(self, dirname: str = "confusion_matrix"):
        super().__init__()
        self.dirname = dirname
        self.paths: list[Path] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._draw(trainer, pl_module, "val", f"epoch{trainer.current_epoch:03d}",
                   f"validation — epoch {trainer.current_epoch}, step {trainer.global_step}")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._draw(trainer, pl_module, "test", "test", f"test — weights of step {trainer.global_step}")

    def _draw(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str, stem: str, title: str) -> None:
        if not writes_now(trainer) or not isinstance(pl_module, ConfusionSource):
            return
        result = pl_module.confusion_result(stage)
        if result is None:
            return
        from ..plots.vision import confusion_matrix_figure

        fig = confusion_matrix_figure(result.matrix, result.class_names, title=title)
        path = save_figure(fig, run_dir(trainer) / self.dirname / f"{stem}.png")
        del fig
        self.paths.append(path)
        log_image(trainer, f"confusion_matrix/{stage}", path)
