"""Stops a run at the next batch once its log file could not be written (a full disk): see attnlab.files.log_file."""

from __future__ import annotations

import lightning as L

from ..files.log_file import raise_if_failed


class RunLogCheck(L.Callback):
    def on_train_batch_end(self, *args, **kwargs) -> None:
        raise_if_failed()

    def on_validation_batch_end(self, *args, **kwargs) -> None:
        raise_if_failed()

    def on_test_batch_end(self, *args, **kwargs) -> None:
        raise_if_failed()
