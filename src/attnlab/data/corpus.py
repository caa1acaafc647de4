"""Raw text sources for the language-model data.

The default corpus is English documentation that ships with CPython itself
(``pydoc_data.topics``, ~465k characters), so training works offline with no download.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..core.errors import DataError, DataFileNotFoundError

# Fixed, sorted list of stdlib modules whose docstrings may be appended for extra text.
# Only modules present on every platform; the text still varies across Python versions,
# which is fine because every cache key hashes the text itself.
STDLIB_DOC_MODULES: tuple[str, ...] = (
    "argparse", "ast", "asyncio", "bisect", "calendar", "collections", "configparser",
    "contextlib", "csv", "dataclasses", "datetime", "decimal", "difflib", "doctest",
    "email", "enum", "fractions", "functools", "heapq", "inspect", "ipaddress",
    "itertools", "json", "logging", "os", "pathlib", "pickle", "pprint", "random",
    "re", "shutil", "statistics", "string", "subprocess", "tarfile", "textwrap",
    "threading", "typing", "unittest", "uuid", "zipfile",
)  # fmt: skip


def pydoc_text(include_stdlib_docstrings: bool = False) -> str:
    """CPython's pydoc topic help texts, joined in sorted-key order with blank lines between.

    Deterministic for a given Python version. With ``include_stdlib_docstrings`` the
    module docstrings of ``STDLIB_DOC_MODULES`` are appended (in that order).
    """
    from pydoc_data.topics import topics

    parts = [topics[k].strip("\n") for k in sorted(topics)]
    if include_stdlib_docstrings:
        for name in STDLIB_DOC_MODULES:
            doc = importlib.import_module(name).__doc__
            if doc and doc.strip():
                parts.append(doc.strip("\n"))
    return "\n\n".join(parts) + "\n"


def decode_utf8_file(path: str | Path, what: str) -> tuple[Path, str]:
    """(absolute path, text) of a UTF-8 file (a leading BOM dropped); one-line errors that name ``what`` and the file.

    :class:`DataFileNotFoundError` (a FileNotFoundError) if missing or a folder; :class:`DataError` (a ValueError) if
    not UTF-8, naming the line and byte offset of the first bad byte, or if it cannot be read.
    """
    p = Path(path).expanduser().absolute()
    if p.is_dir():
        raise DataFileNotFoundError(f"{what} is a folder, not a file: {p}")
    if not p.is_file():
        raise DataFileNotFoundError(f"{what} not found: {p}")
    try:
        data = p.read_bytes()
    except OSError as e:  # e.g. no read permission: the OS's reason, on one line
        raise DataError(f"cannot read {what} {p}: {e.strerror or e}") from e
    try:
        return p, data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        offset = e.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)  # e.start counts after a stripped BOM
        line = data.count(b"\n", 0, offset) + 1
        raise DataError(
            f"{what} is not valid UTF-8: {p}:{line} (byte 0x{data[offset]:02x} at byte offset {offset}, line {line})"
        ) from None


def read_text_file(path: str | Path) -> str:
    """Read a UTF-8 text file, failing with one clear line (see :func:`decode_utf8_file`); empty files too.

    Line endings are kept as they are in the file.
    """
    p, text = decode_utf8_file(path, "text file")
    if not text.strip():
        raise DataError(f"text file is empty: {p}")
    return text
