"""One run per run folder: ``<run dir>/.lock`` holds the pid of the run that writes there.

Two runs started with the same ``hydra.run.dir`` (or two ``resume=auto`` of the same run) would otherwise both
write into one folder: ``last.ckpt`` and ``last-v1.ckpt``, one run's ``config.yaml`` and the other's
``metrics.json``. The lock is an ``flock`` on ``.lock``: the kernel drops it when its process ends, however it ends
(``kill -9`` included), so a lock file left by a dead process is free to take; the pid written in it only serves
the messages. Released (and the file removed) at the end of the run.

Removing a lock file is safe against a run that opened it just before: whoever gets the flock checks that the file
it locked is still the one at ``<run dir>/.lock`` and otherwise tries again.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from ..core.errors import RunFolderBusy

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"


class RunLock:
    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise :class:`RunFolderBusy` naming the folder and the holder's pid (OSError if the
        folder cannot be written)."""
        if self._fd is not None:
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise self._busy(holder) from None
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            os.close(fd)  # its holder released and removed it between our open and our flock: try the new one
        previous = _read_pid(fd)
        if previous and previous != os.getpid():
            log.warning(f"taking over {self.path}: its run (pid {previous}) is no longer running")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def probe(self) -> None:
        """Raise :class:`RunFolderBusy` if a live process holds the lock; touch nothing (no lock file is created,
        a dead run's is left as it is)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise self._busy(_read_pid(fd)) from None
        finally:
            os.close(fd)

    def _busy(self, holder: int | None) -> RunFolderBusy:
        return RunFolderBusy(f"run folder {self.run_dir} is in use by another run (pid {holder or 'unknown'}, lock "
                             f"{self.path}); wait for it to end, or give this run another hydra.run.dir")

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)  # while still locked, so no one takes a file that is going away
        except OSError:
            pass
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
