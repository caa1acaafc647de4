"""Fault injection for the disk-full tests: the disk fills up while a chosen file is written.

Put this folder on ``PYTHONPATH`` and set ``ATTNLAB_DISK_FULL`` (JSON), e.g. ``{"match": "last.ckpt", "skip": 1,
"after": 4096}``: every file the process opens for writing whose path contains ``match`` (a file descriptor is
named through ``/proc/self/fd``; so the temporary files a writer renames are matched by their final name) is
counted; the first ``skip`` of them are written normally, each later one raises ``OSError(ENOSPC)`` once ``after``
bytes went into it, which is what ``write(2)`` answers on a full disk. Python's file objects are C types whose
``write`` cannot be replaced, so a matching file is handed out wrapped in a proxy. Without the variable nothing
changes.
"""

# preloaded_python: fork-safe
# (it replaces builtins.open and io.open, which every writer looks up when it opens a file: a test command forked from
# the preloaded interpreter imports this module before its script runs, as a new interpreter's site module would)
from __future__ import annotations

import builtins
import errno
import io
import json
import os

_SPEC = json.loads(os.environ.get("ATTNLAB_DISK_FULL") or "null")


class _FillingFile:
    def __init__(self, f, path: str, after: int):
        self._f, self._path, self._left = f, path, after

    def write(self, data):
        n = len(data)
        if n > self._left:
            self._left = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)
        self._left -= n
        return self._f.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


if _SPEC:
    _open, _matched = io.open, [0]

    def _name(file) -> str:
        if isinstance(file, int):
            try:
                return os.readlink(f"/proc/self/fd/{file}")
            except OSError:
                return ""
        return os.fspath(file) if isinstance(file, (str, bytes, os.PathLike)) else ""

    def open(file, mode="r", *args, **kwargs):  # noqa: A001
        f = _open(file, mode, *args, **kwargs)
        name = _name(file)
        if any(c in mode for c in "wax+") and _SPEC["match"] in str(name):
            _matched[0] += 1
            if _matched[0] > _SPEC.get("skip", 0):
                return _FillingFile(f, str(name), _SPEC.get("after", 0))
        return f

    io.open = builtins.open = open
