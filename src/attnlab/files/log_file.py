"""The run's log files on a full disk: ``<run dir>/train.log`` (Hydra's job logging) and any other file a library
logs to from this process (W&B's ``debug.log`` in its run folder).

``logging.FileHandler`` answers a failed write by printing logging's own traceback ("--- Logging error ---") and
going on, so a run whose disk filled up kept training (W&B's handler printed its traceback for every record, ~120
times in a short run) until a checkpoint write failed. Here a file handler keeps its first disk-full error instead,
closes its file and drops later records (the console still shows them): :class:`RunLogFile` is the ``file`` handler
of conf/hydra/default.yaml, and :func:`watch_file_handlers` gives every other file handler then attached (W&B's,
once ``wandb.init`` ran) the same answer. :func:`raise_if_failed` raises the error as the run's one-line
:class:`~attnlab.core.errors.DiskFullError` (exit 2). train.py calls it after every batch (the ``RunLogCheck`` callback),
before training and once the run is done, so a run stops at the next batch rather than raising from inside whatever
code happened to log. A failure that is not a full disk gets logging's usual report.
"""

from __future__ import annotations

import logging
import sys
import types
import weakref

from .atomic import disk_full
from ..core.errors import DiskFullError

# the handlers given the disk-full answer: raise_if_failed (after every batch) reads these, not every logger
_WATCHED: weakref.WeakSet[logging.FileHandler] = weakref.WeakSet()


def _handle_error(handler: logging.FileHandler, record: logging.LogRecord) -> None:
    error = sys.exc_info()[1]
    full = disk_full(error, handler.baseFilename, appended=True) if error is not None else None
    if full is None:
        logging.FileHandler.handleError(handler, record)
        return
    handler.failure = full
    stream, handler.stream = handler.stream, None
    try:  # its buffer cannot be written either
        if stream is not None:
            stream.close()
    except OSError:
        pass


class RunLogFile(logging.FileHandler):
    failure: DiskFullError | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _WATCHED.add(self)

    def emit(self, record: logging.LogRecord) -> None:
        if self.failure is None:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        _handle_error(self, record)


def _file_handlers() -> list[logging.FileHandler]:
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    return [h for lg in loggers for h in lg.handlers if isinstance(h, logging.FileHandler)]


def watch_file_handlers() -> None:
    """Give every file handler now attached to a logger the disk-full answer of :class:`RunLogFile`."""
    for handler in _file_handlers():
        if isinstance(handler, RunLogFile) or hasattr(handler, "failure"):
            continue
        handler.failure = None
        plain_emit = handler.emit

        def emit(self, record, plain_emit=plain_emit):
            if self.failure is None:
                plain_emit(record)

        handler.emit = types.MethodType(emit, handler)
        handler.handleError = types.MethodType(_handle_error, handler)
        _WATCHED.add(handler)


def raise_if_failed() -> None:
    """Raise the disk-full error of the first log file of this process that could not be written, if any (of a
    handler still attached: an earlier sweep job's, since replaced, is not this job's)."""
    failed = [h for h in _WATCHED if h.failure is not None]
    if failed:
        attached = set(_file_handlers())
        for handler in failed:
            if handler in attached:
                raise handler.failure
