"""Stop signals between the stages of a run: after training and before the test, and after the test.

During training and the test, :class:`~attnlab.callbacks.preemption.PreemptionCheckpoint` (or Lightning) handles
SIGTERM, SIGUSR1 and Ctrl+C. Between the two stages nothing did: Lightning restores the handlers it found when
``fit`` ends, so a SIGTERM in ``on_fit_end``, or while the test was being set up, ended the process with 143 and no
``job_status.json``, and a sweep died without its summary. :class:`StageSignals` is installed by ``train.py`` before
``fit`` (so that Lightning's teardown puts it back) and only *records* a signal once training has ended, or when
Lightning's SIGTERM notifier passes it on; the entry point then stops as for a stop in training (job marked
interrupted, ``resume=`` runs the test) or, after the test, finishes writing the results of a run that is complete.
While a stage runs it stays out of the way: Lightning acts on a SIGTERM inside its loops, and any other signal gets
what the handler found did (Python's Ctrl+C raises ``KeyboardInterrupt``; SIGUSR1's default ends the process),
unless a callback installed its own.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")


class StageSignals(L.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.between = False  # training has ended and no stage runs now: a signal is recorded
        self.received: str | None = None
        self._previous: dict[int, Any] = {}  # the handlers found at installation

    # the stages open and close the window
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.between = True

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.between = False

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.between = True

    def _handler(self, signum: int, frame: Any) -> None:
        # called by a handler that composes the one it found (Lightning's SIGTERM notifier, while a stage sets up or
        # ends): Lightning acts on it inside its loops; recorded here for the moments after them
        composed = signal.getsignal(signum) != self._handler
        if not self.between and not composed:
            self._previous_action(signum, frame)
            return
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
            sys.stderr.write(f"received {name}: the run stops as soon as the step it is in is done\n")
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl+C twice: stop now

    def _previous_action(self, signum: int, frame: Any) -> None:
        """What the handler found at installation does: Python's Ctrl+C (KeyboardInterrupt), another callable, or
        the default action (the process ends by the signal)."""
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    @contextmanager
    def installed(self) -> Iterator[StageSignals]:
        """The handlers in place for the block (from before ``fit`` to after the results are written)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        for name in STOP_SIGNALS:
            signum = getattr(signal, name, None)
            if signum is not None:
                self._previous[signum] = signal.signal(signum, self._handler)
        try:
            yield self
        finally:
            previous, self._previous = self._previous, {}
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
