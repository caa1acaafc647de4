"""The LM's text, as a list of sources read in line-aligned chunks: never the whole corpus in memory.

A source is CPython's pydoc text (in memory, ~465k characters) or a UTF-8 file; ``data.path`` may name one file, a
folder (every non-hidden file under it, recursively) or a glob (``/data/*.txt``, ``/data/**/*.md``), in sorted
order.

Chunk boundaries and exactness: each file is cut into chunks of about ``chunk_bytes`` right before a line break
(``\\n`` or ``\\r\\n``) that has a non-space character on both sides (and neither is one of the characters that
``data.normalize.remove`` turns into spaces). At such a cut the tokenizer's whole pipeline is local: Unicode
normalization, case folding, the whitespace collapse (see ``shards.chunk_variant`` for its strip), the cut of long
runs and GPT-2's byte-level split all treat ``…x`` + ``\\ny…`` exactly as they treat ``…x\\ny…``. So encoding the chunks one
by one gives, token for token, what encoding the whole file at once gives. A file with no such line break in
``SEARCH_FACTOR`` × ``chunk_bytes`` (one giant line) is cut at a character boundary instead, with a warning: the
tokens next to that cut may differ from a whole-text encoding.
"""

from __future__ import annotations

import glob
import hashlib
import io
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import DataError, DataFileNotFoundError

log = logging.getLogger(__name__)

BOM = b"\xef\xbb\xbf"
SEARCH_FACTOR = 8  # how far (× chunk_bytes) to look for a safe line break before cutting mid-line


@dataclass(frozen=True)
class TextSource:
    """One file (``path``) or an in-memory text (``data``, UTF-8 bytes), named ``name`` in messages and manifests."""

    name: str
    size: int
    path: Path | None = None
    data: bytes | None = None

    @classmethod
    def from_text(cls, name: str, text: str) -> TextSource:
        data = text.encode("utf-8")
        return cls(name=name, size=len(data), data=data)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> TextSource:
        path = Path(path).absolute()
        return cls(name=str(path), size=path.stat().st_size, path=path)

    def fingerprint(self) -> dict:
        """What identifies the content cheaply: path, size and mtime for a file (no read), a hash for a text."""
        if self.path is not None:
            st = self.path.stat()
            return {"path": str(self.path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        return {"name": self.name, "size": self.size, "sha256": hashlib.sha256(self.data).hexdigest()}

    def open(self):
        return io.BytesIO(self.data) if self.data is not None else open(self.path, "rb")  # noqa: SIM115


def resolve_files(path: str | os.PathLike, what: str = "text file") -> list[Path]:
    """The files that ``path`` names: itself, every non-hidden file under a folder, or a glob's matches; sorted."""
    s = os.path.expanduser(str(path))
    p = Path(s).absolute()
    if glob.has_magic(s):
        files = _glob_files(s)
        if not files:
            raise DataFileNotFoundError(f"no {what}s match {p}")
        return files
    if p.is_dir():
        files = _once(sorted(
            f for f in p.rglob("*")
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
        ))  # fmt: skip
        if not files:
            raise DataFileNotFoundError(f"no {what}s in folder {p}")
        return files
    if not p.is_file():
        raise DataFileNotFoundError(f"{what} not found: {p}")
    return [p]


def _glob_files(pattern: str) -> list[Path]:
    """The non-hidden files a glob matches, sorted, each once. ``pathlib``'s ``**`` does not descend into symlinked
    folders (``glob.glob`` does: a link to a parent folder made ``/data/**/*.txt`` list every file 2^40 times and
    never return); a file reached twice through links is read once."""
    parts = Path(pattern).absolute().parts
    i = next(k for k, part in enumerate(parts) if glob.has_magic(part))
    root, rest = Path(*parts[:i]), Path(*parts[i:])
    if rest.name == "**":  # glob.glob's trailing ** matches files too; pathlib's only folders
        rest = rest / "*"
    hidden_ok = any(part.startswith(".") for part in rest.parts)  # a pattern that names hidden files wants them
    return _once(sorted(f for f in root.glob(str(rest)) if f.is_file() and (
        hidden_ok or not any(q.startswith(".") for q in f.relative_to(root).parts))))


def _once(files: list[Path]) -> list[Path]:
    """``files`` without the later ones that are links to an earlier one (read once, not twice)."""
    seen: set[Path] = set()
    out = []
    for f in files:
        real = f.resolve()
        if real not in seen:
            seen.add(real)
            out.append(f)
    return out


def fingerprint(sources: list[TextSource]) -> str:
    """A short hash of every source's fingerprint (cache keys)."""
    h = hashlib.sha256()
    for s in sources:
        h.update(repr(sorted(s.fingerprint().items())).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Chunk:
    """``text`` is bytes ``[start, end)`` of source ``index``; ``first``/``last``: it begins/ends that source."""

    index: int
    start: int
    end: int
    text: str
    first: bool
    last: bool


def iter_chunks(sources: list[TextSource], chunk_bytes: int, start: tuple[int, int] = (0, 0),
                avoid: str = "") -> Iterator[Chunk]:
    """The sources' chunks in order, from byte ``start[1]`` of source ``start[0]`` (a chunk boundary from an earlier
    run: resuming there gives the very chunks an uninterrupted run gives). ``avoid``: characters that may not sit
    next to a cut (the normalizer turns them into spaces)."""
    for i in range(start[0], len(sources)):
        yield from _source_chunks(sources[i], i, start[1] if i == start[0] else 0, chunk_bytes, avoid)


def _source_chunks(src: TextSource, index: int, offset: int, chunk_bytes: int, avoid: str) -> Iterator[Chunk]:
    with src.open() as f:
        begin = 3 if f.read(3) == BOM else 0  # a leading BOM is not text (as "utf-8-sig" reads it)
        base = max(offset, begin)
        f.seek(base)
        buf, eof = bytearray(), False
        while True:
            if not eof and len(buf) < 2 * chunk_bytes + 8:
                eof = _fill(f, buf, 2 * chunk_bytes + 8)
            if not buf:
                return
            cut = len(buf) if eof and len(buf) <= chunk_bytes else _safe_cut(buf, chunk_bytes, len(buf), avoid)
            if cut is None and not eof:
                eof = _fill(f, buf, SEARCH_FACTOR * chunk_bytes + 8)
                cut = _safe_cut(buf, chunk_bytes, len(buf), avoid)
            if cut is None and eof:
                cut = len(buf)  # the rest of the file (at most SEARCH_FACTOR chunks)
            elif cut is None:
                cut = _char_boundary(buf, chunk_bytes)
                log.warning("%s: no line break with text on both sides within %d bytes of byte %d; cut mid-line "
                            "(the tokens at this cut may differ from encoding the file whole)",
                            src.name, SEARCH_FACTOR * chunk_bytes, base)
            text = _decode(bytes(buf[:cut]), src, base)
            end = base + cut
            del buf[:cut]
            yield Chunk(index, base, end, text, first=base == begin, last=eof and not buf)
            base = end


def _fill(f, buf: bytearray, size: int) -> bool:
    """Read until ``buf`` holds ``size`` bytes; True at the end of the file."""
    while len(buf) < size:
        data = f.read(size - len(buf))
        if not data:
            return True
        buf += data
    return False


def _safe_cut(buf: bytearray, target: int, limit: int, avoid: str) -> int | None:
    """The position of a safe cut (see the module docstring) nearest below ``target``, else the first above it."""
    i = buf.rfind(b"\n", 1, target + 1)
    while i > 0:
        cut = _cut_at(buf, i, avoid)
        if cut is not None:
            return cut
        i = buf.rfind(b"\n", 1, i)
    i = buf.find(b"\n", target + 1, limit)
    while i != -1:
        cut = _cut_at(buf, i, avoid)
        if cut is not None:
            return cut
        i = buf.find(b"\n", i + 1, limit)
    return None


def _cut_at(buf: bytearray, i: int, avoid: str) -> int | None:
    """The cut before the line break whose ``\\n`` is at ``i``, if safe: a non-space character on both sides."""
    cut = i - 1 if buf[i - 1] == 0x0D else i
    if cut < 1 or i + 1 >= len(buf):
        return None
    before, after = _char_before(buf, cut), _char_at(buf, i + 1)
    if before is None or after is None:
        return None
    if before.isspace() or after.isspace() or before in avoid or after in avoid:
        return None
    return cut


def _char_before(buf: bytearray, end: int) -> str | None:
    j = end - 1
    while j > 0 and end - j < 4 and buf[j] & 0xC0 == 0x80:  # UTF-8 continuation bytes
        j -= 1
    try:
        return bytes(buf[j:end]).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _char_at(buf: bytearray, i: int) -> str | None:
    b = buf[i]
    n = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 0
    if n == 0 or i + n > len(buf):
        return None
    try:
        return bytes(buf[i : i + n]).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _char_boundary(buf: bytearray, pos: int) -> int:
    pos = min(pos, len(buf))
    while 0 < pos < len(buf) and buf[pos] & 0xC0 == 0x80:
        pos -= 1
    return pos or min(len(buf), 4)


def _decode(data: bytes, src: TextSource, base: int) -> str:
    """UTF-8 text of bytes at offset ``base`` of ``src``; a DataError names the file, line and byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        offset = base + e.start
        with src.open() as f:  # the line number: count the line breaks before the bad byte (only on an error)
            line, left = 1, offset
            while left > 0:
                block = f.read(min(left, 1 << 24))
                line, left = line + block.count(b"\n"), left - len(block)
        raise DataError(f"{_what(src)} is not valid UTF-8: {src.name}:{line} (byte 0x{data[e.start]:02x} at "
                        f"byte offset {offset}, line {line})") from None


def _what(src: TextSource) -> str:
    return "text file" if src.path is not None else src.name


class BlankCheck:
    """Watches the chunks read from ``sources``: if not one of them holds a non-space character, the sources have no
    text, and :meth:`raise_if_blank` says so in one line naming them."""

    def __init__(self, sources: list[TextSource]):
        self.sources = sources
        self.blank = True

    def watch(self, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
        for c in chunks:
            self.blank = self.blank and not c.text.strip()
            yield c

    def raise_if_blank(self) -> None:
        if self.blank:
            names = ", ".join(s.name for s in self.sources[:3]) + (", ..." if len(self.sources) > 3 else "")
            raise DataError(f"text file{'s are' if len(self.sources) > 1 else ' is'} empty: {names}")


def sample_chunks(sources: list[TextSource], budget: int, chunk_bytes: int, avoid: str = "") -> Iterator[Chunk]:
    """What the tokenizer is trained on: every chunk when the corpus holds at most ``budget`` bytes, else about
    ``budget`` bytes in ``chunk_bytes`` windows spread evenly over the whole corpus (each trimmed to whole lines).
    Read with seeks, so the cost is the sample's, not the corpus's."""
    total = sum(s.size for s in sources)
    if total <= budget:
        yield from iter_chunks(sources, chunk_bytes, avoid=avoid)
        return
    starts = [0]
    for s in sources:
        starts.append(starts[-1] + s.size)
    n = max(1, budget // chunk_bytes)
    for k in range(n):
        pos = k * total // n
        i = next(j for j in range(len(sources)) if starts[j + 1] > pos)
        src, off = sources[i], pos - starts[i]
        with src.open() as f:
            begin = 3 if f.read(3) == BOM else 0
            off = max(off, begin)
            f.seek(off)
            data = f.read(chunk_bytes)
        a, b = 0, len(data)
        if off > begin:  # start at a line (or, in one long line, at a character)
            nl = data.find(b"\n")
            a = nl + 1 if nl != -1 else next((j for j in range(min(4, b)) if data[j] & 0xC0 != 0x80), 0)
        if off + b < src.size:  # end at a line break (or a character)
            nl = data.rfind(b"\n", a)
            b = nl if nl > a else _char_boundary(bytearray(data), b - 3)
        if b > a:
            yield Chunk(i, off + a, off + b, _decode(data[a:b], src, off + a), first=off + a == begin,
                        last=off + b == src.size)
