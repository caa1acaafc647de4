"""Files written whole or not at all, and a full disk reported in one line.

Every file a run writes (the data cache's corpus exports, tokenizers and token shards, checkpoints,
``metrics.json``, ``job_status.json``, the explorer page) goes to a temporary file in its folder and is renamed
into place, so the file under its final name is always the previous complete one or the new complete one; a failed
write removes its temporary file. Neither name is written through a link: the temporary file is created anew
(exclusively, so a link or a file planted under its name is replaced, never followed), and the rename replaces a
link at the final name instead of writing where it points. A disk that fills up (or a quota) during the write is a
:class:`~attnlab.core.errors.DiskFullError`: one line naming the file, the space it needed and the space free there,
which the entry points print and exit 2 with.

The error of a full disk is not always an ``OSError`` with its errno: ``torch.save`` reports a failed write of its
zip writer as a ``RuntimeError`` (the ``OSError`` of a Python file object is its context; a C ``fwrite`` leaves
none), so a failed write also counts as a full disk when less space is free than it needed.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from ..core.errors import DiskFullError

FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _size(n: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # not reached


def _free(folder: Path) -> int | None:
    for p in (folder, *folder.parents):
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return None


def disk_full(error: BaseException, path: str | Path, needed: int | None = None,
              appended: bool = False) -> DiskFullError | None:
    """The one-line DiskFullError for ``error``, raised while writing ``path`` (``needed``: its size in bytes, if
    known; a folder: a file under it; ``appended``: a file written line by line, not through a temporary file),
    if the disk was full; None for any other failure."""
    path = Path(path)
    free = _free(path if path.is_dir() else path.parent)
    seen, e, full = set(), error, False
    while e is not None and id(e) not in seen:  # the OSError may be the context of torch's RuntimeError
        seen.add(id(e))
        full = full or (isinstance(e, OSError) and e.errno in FULL)
        e = e.__cause__ or e.__context__
    if not full and not (needed is not None and free is not None and free < needed):
        return None
    need = f"needs {_size(needed)}" if needed is not None else "needs more space"
    where = f"{_size(free)} free there" if free is not None else "free space unknown"
    kept = "what it holds is kept (its last line may be cut)" if appended else \
        "the files already there are kept (it was written to a temporary file)"
    return DiskFullError(f"disk full: cannot write {path} ({need}, {where}); {kept}; free some space, or write "
                         f"elsewhere (paths.cache_dir, hydra.run.dir)")


@contextmanager
def reported(path: str | Path, needed: int | None = None) -> Iterator[None]:
    """Turn a full disk met inside the block, while writing ``path``, into its one-line DiskFullError."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        full = disk_full(e, path, needed)
        if full is None:
            raise
        raise full from None


def temporary_name(path: Path) -> Path:
    """The temporary file beside ``path`` that a write goes to first (hidden, named after this process)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def open_new(path: Path) -> IO[bytes]:
    """``path`` opened for writing as a new file of this process: whatever was under that name (a temporary file a
    killed writer left, a link) is removed first, and ``O_EXCL`` never follows a link created in between."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    return os.fdopen(fd, "wb")


def write_atomic(path: str | Path, data: str | bytes | Callable[[IO[bytes]], None], needed: int | None = None,
                 durable: bool = True) -> Path:
    """Write ``data`` (text as UTF-8, bytes, or a function that writes into the open binary file) to ``path``
    through a temporary file renamed into place; flushed to disk first when ``durable``. A full disk is one line
    (:class:`DiskFullError`); the temporary file never stays."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if isinstance(data, bytes):
        needed = len(data)
    tmp = temporary_name(path)
    try:
        with reported(path, needed):
            path.parent.mkdir(parents=True, exist_ok=True)
            with open_new(tmp) as f:
                if callable(data):
                    data(f)
                else:
                    f.write(data)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
