"""Raw text sources for the language-model data.

The default corpus is English documentation that ships with CPython itself
(``pydoc_data.topics``, ~465k characters), so training works offline with no download.
"""

from __future__ import annotations

import importlib
from pathlib import Path

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


def read_text_file(path: str | Path) -> str:
    """Read a UTF-8 text file (a leading BOM is dropped), failing with one clear line.

    Raises FileNotFoundError if missing, ValueError if not UTF-8 (naming the byte offset
    and line of the first bad byte) or if empty/whitespace-only. Line endings are kept
    as they are in the file.
    """
    p = Path(path).expanduser().absolute()
    if not p.is_file():
        raise FileNotFoundError(f"text file not found: {p}")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        # e.start counts bytes after a stripped BOM, if any.
        offset = e.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, offset) + 1
        raise ValueError(
            f"text file is not valid UTF-8: {p} (byte 0x{data[offset]:02x} at byte offset "
            f"{offset}, line {line})"
        ) from None
    if not text.strip():
        raise ValueError(f"text file is empty: {p}")
    return text
