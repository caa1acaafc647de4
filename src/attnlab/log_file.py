"""The run's log file (``<run dir>/train.log``, written by Hydra's job logging) on a full disk.

``logging.FileHandler`` answers a failed write by printing logging's own traceback ("--- Logging error ---") and
going on, so a run whose disk filled up kept training without a log until its next checkpoint write failed.
:class:`RunLogFile` (the ``file`` handler of conf/hydra/default.yaml) keeps the disk-full error instead, closes the
file and drops later records (the console still shows them); :func:`raise_if_failed` raises that error as the run's
one-line :class:`~attnlab.errors.DiskFullError` (exit 2). train.py calls it after every batch (the ``RunLogCheck``
callback) and once the run is done, so a run stops at the next batch rather than raising from inside whatever code
happened to log. A failure that is not a full disk gets logging's usual report.
"""

from __future__ import annotations

import logging
import sys

from .atomic_files import disk_full
from .errors import DiskFullError


class RunLogFile(logging.FileHandler):
    failure: DiskFullError | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.failure is None:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        error = sys.exc_info()[1]
        full = disk_full(error, self.baseFilename, appended=True) if error is not None else None
        if full is None:
            super().handleError(record)
            return
        self.failure = full
        stream, self.stream = self.stream, None
        try:  # its buffer cannot be written either
            stream.close()
        except OSError:
            pass


def raise_if_failed() -> None:
    """Raise the disk-full error of this process's run log file, if writing it failed."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, RunLogFile) and handler.failure is not None:
            raise handler.failure
