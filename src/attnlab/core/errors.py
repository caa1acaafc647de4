"""Every error the project raises on purpose, and the one handler that turns them into one line and an exit status.

A :class:`UserError` is a bad input the user can fix (a config value, a data file, a checkpoint, a CLI option):
every entry point prints its message as one line and exits with ``exit_code`` (2), without a traceback. Anything
else is a bug and keeps its traceback. ``HYDRA_FULL_ERROR=1`` shows the traceback of a UserError too.

Hydra and Lightning wrap exceptions raised inside what they call (``instantiate`` raises
``InstantiationException from e``), so the handler looks for a UserError along the chain of explicit causes
(``raise ... from``) rather than at the outermost exception only. Not along ``__context__``: an exception raised
while another was being handled is a new failure (a bug in an error path), and it keeps its traceback.

The classes live here, at the bottom of the import layers (docs/layout.md), so that any module can raise one and any
entry point can catch one without importing the module that raises it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class UserError(Exception):
    """A bad input, named in a one-line message; the entry points exit with ``exit_code`` and no traceback."""

    exit_code = 2


# --- a setting ---------------------------------------------------------------------------------------------------


class ConfigError(UserError, ValueError):
    """A config choice that cannot work; train.py prints its one-line message and exits with status 2."""


class PartError(UserError, ValueError):
    """A config-group part that cannot be built; one line naming the group."""


class SettingError(ConfigError, PartError):
    """A part's (or a task's) setting refused by its settings type (:mod:`attnlab.modules.settings`), in one line
    naming the key as the user types it; the same line from train.py's check and from a part built in Python, so
    it is both kinds of refusal."""


class UnsafeTargetError(UserError, ValueError):
    """A config from a file names code outside the allow-list; nothing from it was imported, built or run."""


def at_least(name: str, value: int, lo: int) -> int:
    """``value`` if it is >= ``lo``, else a one-line ConfigError naming the setting (callbacks' ``every_n_*``)."""
    if value < lo:
        raise ConfigError(f"{name} must be >= {lo}, got {value}")
    return value


# --- a data file -------------------------------------------------------------------------------------------------
# They keep the built-in type a caller would expect (ValueError for a bad file, FileNotFoundError for a missing one).


class DataError(UserError, ValueError):
    """A data file (or folder) that is not in the expected format: the message names the file and, where it
    applies, the line or byte offset."""


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A data file or folder that does not exist (or is a folder where a file is expected, or the reverse)."""


class CorpusError(ConfigError, DataError):
    """A speech folder that cannot be read; the message is one line naming the file."""


class CIFAR10FormatError(DataError):
    """A CIFAR-10 batch file that is not what the format says."""


class CIFAR10DownloadError(DataError):
    """``data.download=true`` could not fetch or unpack the archive (no network, a corrupt copy): one line, exit 2,
    instead of urllib's traceback; the user can fetch it by hand."""


class AudioFileError(UserError, ValueError):
    """A WAV file that cannot be used as it is; the message is one line naming the file."""


# --- a checkpoint or a run folder --------------------------------------------------------------------------------


class CheckpointError(UserError, ValueError):
    """A missing, unreadable or wrong-family checkpoint; the message is one line for the user."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint whose unpickling would build something other than tensors and plain containers (run code)."""


class ResumeError(UserError, ValueError):
    """``resume=`` names no run, or a run of another model or data."""


class DamagedCheckpointError(ResumeError):
    """The run to resume has no checkpoint that can be read."""


class FolderError(UserError, OSError):
    """The run folder cannot be created or written."""


class UsedFolderError(UserError, FileExistsError):
    """A new run (or sweep) into a folder that already holds one."""


class RunFolderBusy(UserError, RuntimeError):
    """Another live process holds the run folder's lock."""


# --- a command line's options, input and output -------------------------------------------------------------------


class OptionError(UserError, ValueError):
    """A command-line option with a value the entry point cannot use; the message names key, value and what is
    allowed."""


class InputError(UserError, ValueError):
    """An input file or stdin the entry point cannot read (missing, empty, not UTF-8)."""


class InputTooLongError(UserError, ValueError):
    """on_too_long=error: an input line has more tokens than the model's position table."""


class OutputError(UserError, OSError):
    """An output path the entry point cannot write (a file where a folder must be, a read-only disk)."""


# --- reading finished runs back -----------------------------------------------------------------------------------


class RunHistoryError(UserError, ValueError):
    """A run's logged metrics file that cannot be read (not UTF-8, not CSV)."""


class SweepJobError(UserError, ValueError):
    """A job folder's file that cannot be read (corrupt YAML or JSON, a value of the wrong type): one line naming
    it, so that a comparison never stops on a traceback nor reads a damaged file as something else."""


class CompareError(UserError, ValueError):
    """A sweep, metric or option that cannot be compared; the command prints its one line and exits with 2."""


class WandbRunError(UserError):
    """An offline W&B run could not be read."""


class WorkspaceError(UserError):
    """The folder cannot be turned into a workspace (no jobs, no W&B runs, an unlogged metric)."""


# --- a failed run (not a bad input: exit 1) -----------------------------------------------------------------------


class NonFiniteLossError(RuntimeError):
    """The training loss or gradient norm was not finite (more often than ``max_skips`` allows), or an optimizer
    step made the parameters non-finite. train.py prints its one line and exits with 1 (the run failed; not a bad
    input). Raised by :class:`attnlab.callbacks.nonfinite.NonFiniteGuard`."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, read-only); earlier checkpoints are intact. One line,
    exit 1. Raised by :class:`attnlab.files.checkpoint_io.AtomicCheckpointIO`."""


class PeerError(RuntimeError):
    """Another process of a distributed run never arrived or is gone (its node lost, refused, crashed). One line
    naming it, exit 1, on every rank that is left. Raised by :mod:`attnlab.runs.ddp`."""


class JobStopped(Exception):
    """A stop signal ended one job of a sweep that submitit runs (its state saved, its status "interrupted"): the
    job returns, and the sweep's other jobs, other processes, go on. Raised by :mod:`attnlab.runs.outcome`."""

    def __init__(self, signame: str):
        super().__init__(f"stopped by {signame}")
        self.signame = signame


def find_user_error(error: BaseException | None) -> UserError | None:
    """The first UserError in ``error``'s chain of explicit causes (itself included), or None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__
    return None


def one_line_message(error: BaseException) -> str:
    """The error's message on one line (the first line of a multi-line message)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextmanager
def one_line_errors(log: logging.Logger) -> Iterator[None]:
    """Run an entry point's body: a UserError (anywhere in the chain) is logged as one line and exits with its
    status; everything else propagates with its traceback."""
    try:
        yield
    except Exception as e:
        err = find_user_error(e)
        if err is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        log.error(one_line_message(err))
        sys.exit(err.exit_code)


class DiskFullError(UserError, OSError):
    """A write found the disk full or over quota (ENOSPC, EDQUOT): one line naming the file, the space it needed and
    the space free; exit 2. Every writer of a run writes a temporary file and renames it, so nothing already written
    is lost (the previous ``last.ckpt``, the cache's complete files). Raised by :mod:`attnlab.files.atomic`."""
