"""Sentence pairs for translation: the ``Pair`` record, length buckets, a strict TSV reader and splitting.

TSV format (what Tatoeba / manythings.org Anki exports look like)::

    source<TAB>target[<TAB>anything else, e.g. the attribution]

* Columns after the second are ignored. Each side is stripped of surrounding whitespace (so Windows ``\\r\\n``
  line ends are fine).
* Blank (whitespace-only) lines are skipped; blank lines at the end of the file silently, others with one
  warning giving their count and the first one's line number.
* Header lines at the top of the file that start with ``#`` and contain no tab (Anki's ``#separator:tab``,
  ``#html:false``) are skipped.
* Everything else is an error with one line naming the file and the line: no tab, an empty source or target,
  bytes that are not UTF-8 (with the byte offset), a missing file, a file without any pair.

Splitting (``split_pairs``) is grouped by source sentence: pairs sharing a source (Tatoeba has many: "Go." ->
"Va !", "Go." -> "Marche.") always land in the same split, so no test source was seen in training.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..files.atomic import reported
from ..core.errors import ConfigError, DataError
from .corpus import decode_utf8_file

log = logging.getLogger(__name__)

DEFAULT_BUCKET_EDGES: tuple[int, ...] = (3, 6, 9)  # buckets 1-3, 4-6, 7-9, 10+ source words


@dataclass(frozen=True)
class Pair:
    """One sentence pair. ``bucket`` indexes ``bucket_names(edges)`` (source length in words).

    ``n``: the integer a numbers pair spells (None for a user corpus); ``name``: the personal name embedded in a
    copy pair (None otherwise); ``line``: 1-based line in the file it was read from (0 when generated).
    """

    src: str
    tgt: str
    bucket: int = 0
    n: int | None = None
    name: str | None = None
    line: int = 0


# --------------------------------------------------------------------------------------
# Length buckets
# --------------------------------------------------------------------------------------
def check_bucket_edges(edges: Iterable[int]) -> tuple[int, ...]:
    edges = tuple(int(e) for e in edges)
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ConfigError(f"bucket_edges must be increasing positive word counts, e.g. [3, 6, 9], got {list(edges)}")
    return edges


def num_words(text: str) -> int:
    """Whitespace-separated words: a hyphenated compound ("twenty-one", "quatre-vingts") counts as one."""
    return len(text.split())


def length_bucket(text: str, edges: Sequence[int] = DEFAULT_BUCKET_EDGES) -> int:
    """Index of the bucket holding ``num_words(text)``: edges (3, 6, 9) -> 0: 1-3, 1: 4-6, 2: 7-9, 3: 10+."""
    n = num_words(text)
    for i, edge in enumerate(edges):
        if n <= edge:
            return i
    return len(edges)


def bucket_names(edges: Sequence[int] = DEFAULT_BUCKET_EDGES) -> list[str]:
    """Human-readable bucket labels: (3, 6, 9) -> ['1-3', '4-6', '7-9', '10+']."""
    names, lo = [], 1
    for edge in edges:
        names.append(f"{lo}-{edge}" if edge > lo else f"{lo}")
        lo = edge + 1
    return [*names, f"{lo}+"]


# --------------------------------------------------------------------------------------
# Reading a user's corpus
# --------------------------------------------------------------------------------------
def _snippet(line: str, width: int = 40) -> str:
    return repr(line if len(line) <= width else line[:width] + "...")


def read_parallel_tsv(path: str | os.PathLike, edges: Sequence[int] = DEFAULT_BUCKET_EDGES) -> list[Pair]:
    """All pairs of a tab-separated parallel corpus, in file order (see the module doc for the format).

    Raises DataFileNotFoundError (a FileNotFoundError: missing file, or a folder) or DataError (a ValueError), both
    UserErrors, always with one line that names the file (absolute) and, for a bad line, its number:
    ``/abs/corpus.tsv:12: no tab between source and target: 'Hello.'``.
    """
    p, text = decode_utf8_file(path, "parallel corpus")
    pairs: list[Pair] = []
    blank: list[int] = []  # line numbers of blank lines seen since the last pair
    skipped_blank, first_blank = 0, 0
    header = True
    for lineno, raw in enumerate(text.split("\n"), start=1):  # not splitlines(): \x0b, \u2028 ... are text
        if not raw.strip():
            blank.append(lineno)
            continue
        if header and raw.startswith("#") and "\t" not in raw:
            continue  # Anki export header (#separator:tab, #html:false, ...)
        header = False
        if blank:  # blank lines followed by a pair: worth a warning (trailing ones are not)
            skipped_blank += len(blank)
            first_blank = first_blank or blank[0]
            blank = []
        cols = raw.split("\t")
        if len(cols) < 2:
            raise DataError(f"{p}:{lineno}: no tab between source and target: {_snippet(raw)}")
        src, tgt = cols[0].strip(), cols[1].strip()
        if not src:
            raise DataError(f"{p}:{lineno}: empty source sentence: {_snippet(raw)}")
        if not tgt:
            raise DataError(f"{p}:{lineno}: empty target sentence: {_snippet(raw)}")
        pairs.append(Pair(src, tgt, bucket=length_bucket(src, edges), line=lineno))
    if not pairs:
        raise DataError(f"parallel corpus has no sentence pairs: {p}")
    if skipped_blank:
        log.warning(f"{p}: skipped {skipped_blank} blank line(s) (first: line {first_blank})")
    return pairs


def split_pairs(
    pairs: Sequence[Pair], val_fraction: float, test_fraction: float, seed: int
) -> dict[str, list[Pair]]:
    """Deterministic train/val/test split by ``seed``, grouped by source sentence (see the module doc).

    The distinct sources are shuffled and the first ``round(fraction * n_sources)`` go to val, the next ones to
    test (at least one each when the fraction is > 0); pairs keep their file order inside each split.
    """
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ConfigError(
            f"val_fraction={val_fraction} and test_fraction={test_fraction} must be in [0, 1) and sum to < 1"
        )
    sources = list(dict.fromkeys(p.src for p in pairs))  # distinct, first-appearance order
    n = len(sources)
    n_val = max(1, round(val_fraction * n)) if val_fraction > 0 else 0
    n_test = max(1, round(test_fraction * n)) if test_fraction > 0 else 0
    if n - n_val - n_test < 1:
        raise DataError(f"{n} distinct source sentences are too few for a train/val/test split")
    order = np.random.default_rng(seed).permutation(n)
    where = {}
    for rank, i in enumerate(order.tolist()):
        where[sources[i]] = "val" if rank < n_val else "test" if rank < n_val + n_test else "train"
    out: dict[str, list[Pair]] = {"train": [], "val": [], "test": []}
    for p in pairs:
        out[where[p.src]].append(p)
    return out


# --------------------------------------------------------------------------------------
# Cached split files (generated data)
# --------------------------------------------------------------------------------------
TSV_COLUMNS = ("src", "tgt", "n", "bucket", "name")


def pairs_to_tsv(pairs: Iterable[Pair]) -> str:
    """Our own cache format: a header line, then src, tgt, n, bucket, name (empty for None) per line."""
    lines = ["\t".join(TSV_COLUMNS)]
    for p in pairs:
        fields = (p.src, p.tgt, "" if p.n is None else str(p.n), str(p.bucket), p.name or "")
        if any(("\t" in f or "\n" in f) for f in fields):
            raise ValueError(f"a field contains a tab or newline: {fields!r}")
        lines.append("\t".join(fields))
    return "\n".join(lines) + "\n"


def pairs_from_tsv(path: str | os.PathLike) -> list[Pair]:
    """Inverse of ``pairs_to_tsv`` (for files this package wrote)."""
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    if lines[0].split("\t") != list(TSV_COLUMNS):
        raise DataError(f"not a cached split file (header {lines[0]!r}): {path}")
    out = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        src, tgt, n, bucket, name = line.split("\t")
        out.append(Pair(src, tgt, int(bucket), int(n) if n else None, name or None, lineno))
    return out


def write_split_dir(directory: str | os.PathLike, files: dict[str, str]) -> Path:
    """Write ``{file name: text}`` into ``directory`` atomically as a whole.

    The files go to a fresh temporary sibling directory that is then renamed into place, so a reader (another DDP
    rank, a parallel sweep job) sees either no directory or all files complete. If another process got there
    first, its (identical) directory is kept and ours discarded.
    """
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        for name, text in files.items():
            data = text.encode("utf-8")
            with reported(final / name, len(data)):
                (tmp / name).write_bytes(data)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
