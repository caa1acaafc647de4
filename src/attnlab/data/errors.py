"""Errors for a data file or folder the user pointed at that cannot be read: one line naming the file.

Both are :class:`~attnlab.errors.UserError` s, so ``train.py`` prints the message alone and exits with status 2. They
also keep the built-in type a caller would expect (``ValueError`` for a bad file, ``FileNotFoundError`` for a missing
one), so code and tests written against those keep working.
"""

from __future__ import annotations

from ..errors import UserError
from ..utils.config import ConfigError  # noqa: F401  (re-exported: data modules raise both, for a setting or a file)


class DataError(UserError, ValueError):
    """A data file (or folder) that is not in the expected format: the message names the file and, where it
    applies, the line or byte offset."""


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A data file or folder that does not exist (or is a folder where a file is expected, or the reverse)."""
