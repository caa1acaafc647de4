"""Errors the project raises on purpose, and the one handler that turns them into one line and an exit status.

A :class:`UserError` is a bad input the user can fix (a config value, a data file, a checkpoint, a CLI option):
every entry point prints its message as one line and exits with ``exit_code`` (2), without a traceback. Anything
else is a bug and keeps its traceback. ``HYDRA_FULL_ERROR=1`` shows the traceback of a UserError too.

Hydra and Lightning wrap exceptions raised inside what they call (``instantiate`` raises
``InstantiationException from e``), so the handler looks for a UserError along the ``__cause__``/``__context__``
chain rather than at the outermost exception only.
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


class OptionError(UserError, ValueError):
    """An option with a value the code cannot use (a CLI's, or a decoding option); the message names key, value and
    what is allowed: ``key=value is not allowed: <what is>``."""


class NonFiniteLossError(RuntimeError):
    """The training loss or gradient norm was not finite (more often than ``max_skips`` allows), or an optimizer
    step made the parameters non-finite. train.py prints its one line and exits with 1 (the run failed; not a bad
    input). Raised by :class:`attnlab.callbacks.nonfinite.NonFiniteGuard`."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, read-only); earlier checkpoints are intact. One line,
    exit 1. Raised by :class:`attnlab.utils.checkpoint_io.AtomicCheckpointIO`."""


def find_user_error(error: BaseException | None) -> UserError | None:
    """The first UserError in ``error``'s chain of causes (itself included), or None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
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
    is lost (the previous ``last.ckpt``, the cache's complete files). Raised by :mod:`attnlab.atomic_files`."""
