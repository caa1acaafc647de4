"""Files stay in their folder: what a run folder may hold, and what a path read from a file may name.

Run and sweep folders are copied, shared and unpacked from others, so what they hold is input like any other. Two
rules follow, each checked before anything is written (the data cache is this machine's own: a link there, to a
bigger disk say, is the user's and is followed):

* **No link leads a writer out.** A folder the project writes into holds no symbolic link (to a file, to a folder,
  dangling) outside the subfolders that belong to another program: W&B keeps links of its own under ``wandb/``
  (``latest-run``, ``debug.log``, one into its cache) and replaces them by renaming, never writing through them. A
  link found anywhere else is refused in one line (:func:`check_no_links`); a single output file is written through
  :func:`attnlab.files.atomic.write_atomic`, whose rename replaces a link at its name instead of following it.
* **A path read from a file is a name, not a place.** A checkpoint's callback state records its own files
  (``best_model_path``, the top-k files, the journal of copies to make and files to remove), a corpus list its
  files. Such a value is used only as a plain file name inside the folder it belongs to (:func:`name_in`,
  :func:`plain_name`); an absolute path elsewhere, a ``..``, a URL or a name with a separator is refused, never acted
  on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..core.errors import FolderError

# subfolders another program writes, with links of its own that it replaces instead of writing through
OTHER_PROGRAMS = ("wandb",)
# the single-path fields of a ModelCheckpoint state (besides its top-k dict and RunCheckpoint's journal lists)
CHECKPOINT_PATH_FIELDS = ("best_model_path", "last_model_path", "kth_best_model_path")


def plain_name(value: object) -> bool:
    """A file name with no folder part: not empty, no separator, not ``.`` or ``..``, no URL scheme."""
    if not isinstance(value, str) or not value or value in (".", ".."):
        return False
    return "/" not in value and "\\" not in value and "\0" not in value and ":" not in value


def name_in(folder: str | Path, value: object) -> str | None:
    """The plain file name ``value`` names directly inside ``folder`` (given as written: ``<folder>/<name>``, with
    no ``..``, ``.`` or doubled separator), or None for anything else (another folder, a URL, a relative path)."""
    if not isinstance(value, str) or not value:
        return None
    parent, sep, name = value.rpartition("/")
    if not sep or parent != str(folder).rstrip("/") or not plain_name(name):
        return None
    return name


def links_in(folder: str | Path, skip: Iterable[str] = OTHER_PROGRAMS) -> Iterator[Path]:
    """Every symbolic link under ``folder`` (links are not followed), except below its top-level subfolders named in
    ``skip``; such a subfolder that is itself a link is reported."""
    folder = Path(folder)
    skipped = set(skip)
    for root, dirs, files in os.walk(folder, followlinks=False):
        here = Path(root)
        for name in [*dirs, *files]:
            path = here / name
            if path.is_symlink():
                yield path
        if here == folder:
            dirs[:] = [d for d in dirs if d not in skipped]
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]


def _describe(link: Path) -> str:
    try:
        target = os.readlink(link)
    except OSError:
        target = "?"
    return f"{link} is a link (to {target})"


def check_no_links(folder: str | Path, what: str) -> None:
    """Refuse, in one line, a ``folder`` (``what``: "run folder", "sweep folder") that holds a link a writer could
    follow out of it."""
    for link in links_in(folder):
        raise FolderError(f"{_describe(link)}: a {what} is written only through plain files and folders; replace "
                          f"the link with the file itself, or remove it")


# Lightning's own names for a checkpoint (trainer.fit/test(ckpt_path="last"|"best"|...)): not files to read here
LIGHTNING_CKPT_NAMES = ("last", "best", "hpc")


def names_a_local_checkpoint(value: Any) -> bool:
    """``ckpt_path`` names a file here to read and check, not a name Lightning resolves itself (``last``, a URL)."""
    return bool(value) and str(value) not in LIGHTNING_CKPT_NAMES and "://" not in str(value)


def aside_name(folder: Path) -> Path:
    """Where a folder moved aside goes: ``<folder>.old-<time>`` (``-1``, ``-2`` ... after a name taken)."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    aside, n = folder.with_name(f"{folder.name}.old-{stamp}"), 1
    while aside.exists():
        aside, n = folder.with_name(f"{folder.name}.old-{stamp}-{n}"), n + 1
    return aside
