"""Token shards: a corpus of any size tokenized in chunks into ``uint16``/``uint32`` files, read back as one stream.

On disk (``<cache_dir>/tokens/<key>/``)::

    manifest.json          sources (path, size, mtime), tokenizer hash, dtype, shards with token counts, complete
    shard-00000.bin ...    raw little-endian ids (nanoGPT's train.bin, cut into ~shard_tokens pieces)

The key hashes the sources' fingerprints, the tokenizer JSON and the chunking settings, so a changed file (size or
mtime) or tokenizer gets new shards. Memory stays bounded whatever the corpus size: chunks of ``chunk_bytes`` (cut
at line breaks, see ``text_sources``) go ``batch_chunks`` at a time through ``tokenizers``' parallel
``encode_batch`` straight into the open shard file.

Interruption: a shard is written to a temporary name and renamed when complete; only then does the manifest
(rewritten atomically) list it, with the source position where the next shard starts. A later run trusts only
the shards the manifest lists (and whose size matches), continues from the last one's end (the chunk boundaries,
hence the tokens, are the same as an uninterrupted run's) and marks the manifest complete at the end. Several
sources are tokenized one after the other with an ``<eos>`` between them (documents), each framed as its
tokenizer frames a text (a LLaMA's ``<s>`` before it: :func:`framing`).

Reading: :class:`TokenStream` is the shards as one array (length, slices that may cross shards, views for the
splits), memory-mapped lazily: a DDP rank or a DataLoader worker maps pages of the windows it reads, never the
corpus, and a pickled stream carries paths, not data.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from ..files.atomic import reported, write_atomic
from .text_sources import Chunk, TextSource, fingerprint, iter_chunks
from .tokenizer import BPETokenizer

log = logging.getLogger(__name__)

# v2: each shard's content sample digest in the manifest (a swapped or overwritten shard is rebuilt)
FORMAT_VERSION = "shards-v2"
SAMPLE_BYTES = 1 << 16  # a shard's digest covers its first, middle and last 64 KiB (all of a small shard)
CHUNK_BYTES = 1 << 20  # 1 MiB of text per encode call
SHARD_TOKENS = 1 << 26  # ~64M tokens per shard (128 MiB as uint16)
PROGRESS_MIN_BYTES = 32 << 20  # a progress bar for corpora from this size on
MANIFEST = "manifest.json"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


# --------------------------------------------------------------------------------------
# A source's text, chunk by chunk, as if encoded whole
# --------------------------------------------------------------------------------------
def chunk_variant(tok: Tokenizer, first: bool, last: bool) -> Tokenizer:
    """``tok`` for a chunk that is (or is not) the first or last of its source (the same object if nothing differs):
    every ``Strip`` step of its normalizer limited to the source's ends (``data.normalize.whitespace`` strips the ends
    of the *text*; a chunk inside a file must keep the line break it starts with, which that normalizer would strip
    and then collapse into a space), and a start marker a model folder's tokenizer puts before a text (a LLaMA's
    ``Prepend("▁")`` normalizer or ``Metaspace`` with ``prepend_scheme: first``) only before the source's first
    chunk."""
    spec = json.loads(tok.to_str())
    changed = False

    def visit(node):
        nonlocal changed
        if isinstance(node, dict):
            kind = node.get("type")
            if kind == "Strip" and not (first and last):
                changed = True
                node["strip_left"] = node.get("strip_left", True) and first
                node["strip_right"] = node.get("strip_right", True) and last
            elif kind == "Prepend" and not first and node.get("prepend"):
                changed, node["prepend"] = True, ""
            elif kind == "Metaspace" and not first and node.get("prepend_scheme") == "first":
                changed, node["prepend_scheme"] = True, "never"
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(spec.get("normalizer"))
    visit(spec.get("pre_tokenizer"))
    if not changed:
        return tok
    out = Tokenizer.from_str(json.dumps(spec))
    out.encode_special_tokens = tok.encode_special_tokens
    return out


def framing(tok: Tokenizer) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after a text (a LLaMA's ``<s>``; none for GPT-2 and
    attnlab's own): a source starts and ends with them, as ``encode`` of the whole text would give them."""
    bare, full = tok.encode("a", add_special_tokens=False).ids, tok.encode("a").ids
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return full[:i], full[i + len(bare):]
    return [], []


class ChunkEncoder:
    """Encodes a source chunk by chunk to the ids of encoding it whole: its normalizer's strip and start marker,
    and its post-processor's ids (:func:`framing`), only at the source's ends."""

    def __init__(self, tok: Tokenizer):
        self._tok = tok
        self._variants: dict[tuple[bool, bool], Tokenizer] = {}
        self.prefix, self.suffix = framing(tok)

    def tokenizer(self, chunk: Chunk) -> Tokenizer:
        key = (chunk.first, chunk.last)
        if key not in self._variants:
            self._variants[key] = chunk_variant(self._tok, *key)
        return self._variants[key]

    def normalize(self, chunk: Chunk) -> str:
        n = self.tokenizer(chunk).normalizer
        return chunk.text if n is None else n.normalize_str(chunk.text)

    def encode(self, chunks: list[Chunk]) -> list[list[int]]:
        """Ids of each chunk; chunks that share a variant go through one parallel ``encode_batch``."""
        out: list[list[int] | None] = [None] * len(chunks)
        groups: dict[tuple[bool, bool], list[int]] = {}
        for i, c in enumerate(chunks):
            groups.setdefault((c.first, c.last), []).append(i)
        for (first, last), idx in groups.items():
            tok = self.tokenizer(chunks[idx[0]])
            encoded = tok.encode_batch_fast([chunks[i].text for i in idx], add_special_tokens=False)
            for i, enc in zip(idx, encoded):
                out[i] = (self.prefix if first else []) + enc.ids + (self.suffix if last else [])
        return out


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------
def shards_dir(sources: list[TextSource], tok: BPETokenizer, cache_dir: str | os.PathLike,
               chunk_bytes: int = CHUNK_BYTES, shard_tokens: int = SHARD_TOKENS) -> Path:
    h = hashlib.sha256(f"{FORMAT_VERSION}\n{chunk_bytes}\n{shard_tokens}\n{fingerprint(sources)}\n".encode())
    text = tok.to_str()
    h.update(text.encode("utf-8"))
    if framing(tok._tok) != ([], []) or '"Prepend"' in text or '"prepend_scheme":"first"' in text:
        # a model folder's tokenizer that frames a text (<s>, a prepended ▁): framed once per source since
        # shards-v2's first writers, which framed every chunk (attnlab's own tokenizers keep their shards)
        h.update(b"\nframed once per source")
    return Path(cache_dir) / "tokens" / h.hexdigest()[:16]


def manifest_header(sources: list[TextSource], tok: BPETokenizer, chunk_bytes: int = CHUNK_BYTES,
                    shard_tokens: int = SHARD_TOKENS) -> dict:
    """What a manifest records about how its shards were made; a manifest that differs is not trusted."""
    return {
        "format": FORMAT_VERSION,
        "sources": [s.fingerprint() for s in sources],
        "tokenizer_sha256": _tokenizer_hash(tok),
        "vocab_size": tok.vocab_size,
        "dtype": token_dtype(tok.vocab_size).name,
        "chunk_bytes": chunk_bytes,
        "shard_tokens": shard_tokens,
    }


def _tokenizer_hash(tok: BPETokenizer) -> str:
    return hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()


def read_manifest(out_dir: Path) -> dict | None:
    """The manifest, or None when there is none or it is damaged (not JSON, or not the shape written here): the
    shards are then rebuilt, never read through a manifest that cannot describe them."""
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    except (FileNotFoundError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if _well_formed(manifest):
        return manifest
    log.warning("%s is damaged (not the shape of a shard manifest): the shards are rebuilt", out_dir / MANIFEST)
    return None


def _well_formed(manifest) -> bool:
    try:
        np.dtype(manifest["dtype"])
        return isinstance(manifest["shards"], list) and all(
            isinstance(s["file"], str) and "/" not in s["file"] and isinstance(s["tokens"], int)
            and isinstance(s["next"], list) and len(s["next"]) == 2 for s in manifest["shards"])
    except (TypeError, KeyError, ValueError):
        return False


def _write_manifest(out_dir: Path, manifest: dict) -> None:
    _atomic_write(out_dir / MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))


def _atomic_write(path: Path, data: bytes) -> None:
    write_atomic(path, data)


def sample_digest(path: Path) -> str:
    """sha256 of a shard's first, middle and last ``SAMPLE_BYTES`` (the whole file when it is small): what the
    manifest records, so that reading a cached corpus stays a few small reads whatever its size."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= 3 * SAMPLE_BYTES:
            h.update(f.read())
        else:
            for start in (0, (size - SAMPLE_BYTES) // 2, size - SAMPLE_BYTES):
                f.seek(start)
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def trusted_shards(out_dir: Path, manifest: dict, warn: bool = True) -> list[dict]:
    """The manifest's shards whose files are there with the size and sample digest it records, up to the first
    that is not (named in a warning: it is rebuilt from there)."""
    itemsize = np.dtype(manifest["dtype"]).itemsize
    ok = []
    for s in manifest["shards"]:
        p = out_dir / s["file"]
        if not p.is_file():
            problem = "is missing"
        elif p.stat().st_size != s["tokens"] * itemsize:
            problem = f"has {p.stat().st_size} bytes, its manifest {s['tokens'] * itemsize} (truncated or replaced)"
        elif s.get("sha256") != sample_digest(p):
            problem = "is not the shard that was written (its content differs from its manifest's digest)"
        else:
            ok.append(s)
            continue
        if warn:
            log.warning("cached token shard %s %s: the shards are rebuilt from there", p, problem)
        break
    return ok


def matches(manifest: dict | None, header: dict) -> bool:
    """The manifest was written for these sources, tokenizer and settings (not another corpus's, swapped in)."""
    return manifest is not None and all(manifest.get(k) == v for k, v in header.items())


def complete_manifest(out_dir: Path, sources: list[TextSource], tok: BPETokenizer) -> dict | None:
    """The manifest of ``out_dir`` if its shards hold every token of these sources, made with this tokenizer, and
    every shard file is the one written; else None (the shards are built, or finished, from there)."""
    manifest = read_manifest(out_dir)
    if (matches(manifest, manifest_header(sources, tok)) and manifest.get("complete")
            and trusted_shards(out_dir, manifest, warn=False) == manifest["shards"]):
        return manifest
    return None


def _remove_stale_temp_files(out_dir: Path, older_than_s: float = 60.0) -> None:
    """Temp files of an interrupted run (a live writer touches its own every few seconds)."""
    now = time.time()
    for p in out_dir.glob(".*.tmp"):
        try:
            if now - p.stat().st_mtime > older_than_s:
                p.unlink()
        except FileNotFoundError:
            pass


def build_shards(sources: list[TextSource], tok: BPETokenizer, out_dir: str | os.PathLike,
                 chunk_bytes: int = CHUNK_BYTES, shard_tokens: int = SHARD_TOKENS, batch_chunks: int | None = None,
                 avoid: str = "", progress: bool | None = None) -> dict:
    """Tokenize ``sources`` into shards under ``out_dir`` (resuming a run that was cut short); the manifest."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tok.vocab_size)
    header = manifest_header(sources, tok, chunk_bytes, shard_tokens)
    old = read_manifest(out_dir)
    shards: list[dict] = []
    if old is not None and not matches(old, header):
        log.warning("%s was written for other sources, another tokenizer or other settings: the shards are "
                    "rebuilt", out_dir / MANIFEST)
    if matches(old, header):
        shards = trusted_shards(out_dir, old)
        if old.get("complete") and len(shards) == len(old["shards"]):
            return old
    manifest = {**header, "shards": shards, "complete": False}
    start = tuple(shards[-1]["next"]) if shards else (0, 0)
    if shards:
        log.info("resuming the tokenization into %s after %d complete shard(s)", out_dir, len(shards))
    _remove_stale_temp_files(out_dir)

    total = sum(s.size for s in sources)
    done_bytes = sum(s.size for s in sources[: start[0]]) + start[1]
    show = progress if progress is not None else total >= PROGRESS_MIN_BYTES
    batch_chunks = batch_chunks or max(2, 2 * (os.cpu_count() or 1))
    encoder = ChunkEncoder(tok._tok)
    t0 = time.perf_counter()
    n_bytes = 0

    with _Progress(show, total, done_bytes, out_dir.name) as bar:
        writer = _ShardWriter(out_dir, len(shards), dtype)
        pending: list[Chunk] = []

        def flush():
            nonlocal n_bytes
            for chunk, ids in zip(pending, encoder.encode(pending)):
                writer.write(np.asarray(ids, dtype=dtype))
                if chunk.last and chunk.index < len(sources) - 1 and encoder.suffix[-1:] != [tok.eos_id]:
                    writer.write(np.array([tok.eos_id], dtype=dtype))  # documents separated by <eos>
                n_bytes += chunk.end - chunk.start
                bar.advance(chunk.end - chunk.start)
                if writer.tokens >= shard_tokens:
                    _close_shard(writer, chunk, sources, manifest, out_dir)
            pending.clear()

        try:
            for chunk in iter_chunks(sources, chunk_bytes, start, avoid):
                pending.append(chunk)
                if len(pending) >= batch_chunks:
                    flush()
            flush()
            if writer.tokens or not manifest["shards"]:
                _close_shard(writer, None, sources, manifest, out_dir)
        finally:
            writer.abort()  # an unfinished shard (an exception, Ctrl-C) is removed; the manifest never listed it
    manifest["complete"] = True
    manifest["tokens"] = sum(s["tokens"] for s in manifest["shards"])
    _write_manifest(out_dir, manifest)
    dt = time.perf_counter() - t0
    log.info("tokenized %.1f MB into %d tokens in %d shard(s) in %.1f s (%.1f MB/s): %s", n_bytes / 1e6,
             manifest["tokens"], len(manifest["shards"]), dt, n_bytes / 1e6 / max(dt, 1e-9), out_dir)
    return manifest


def _close_shard(writer: _ShardWriter, chunk: Chunk | None, sources: list[TextSource], manifest: dict,
                 out_dir: Path) -> None:
    """Rename the shard into place, then record it (and where the next one starts) in the manifest."""
    if chunk is None:
        nxt = [len(sources), 0]
    elif chunk.last:
        nxt = [chunk.index + 1, 0]
    else:
        nxt = [chunk.index, chunk.end]
    name, n = writer.finish()
    manifest["shards"].append({"file": name, "tokens": n, "next": nxt, "sha256": sample_digest(out_dir / name)})
    _write_manifest(out_dir, manifest)


class _ShardWriter:
    """Appends ids to ``.shard-NNNNN.bin.<random>.tmp`` (opened at the first write); ``finish`` renames it to
    ``shard-NNNNN.bin``, ``abort`` removes it."""

    def __init__(self, out_dir: Path, index: int, dtype: np.dtype):
        self.out_dir, self.index, self.dtype = out_dir, index, dtype
        self.f, self.tokens = None, 0

    @property
    def name(self) -> str:
        return f"shard-{self.index:05d}.bin"

    def write(self, ids: np.ndarray) -> None:
        with reported(self.out_dir / self.name, (self.tokens + len(ids)) * self.dtype.itemsize):
            if self.f is None:
                fd, self.tmp = tempfile.mkstemp(dir=self.out_dir, prefix=f".{self.name}.", suffix=".tmp")
                self.f = os.fdopen(fd, "wb")
            self.f.write(ids.astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        self.tokens += len(ids)

    def finish(self) -> tuple[str, int]:
        if self.f is None:
            self.write(np.empty(0, dtype=self.dtype))
        with reported(self.out_dir / self.name, self.tokens * self.dtype.itemsize):
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            os.replace(self.tmp, self.out_dir / self.name)
        out = (self.name, self.tokens)
        self.f, self.tokens, self.index = None, 0, self.index + 1
        return out

    def abort(self) -> None:
        if self.f is not None:
            try:
                self.f.close()  # its buffer cannot be flushed onto a full disk: the error that stopped us is raised
            except OSError:
                pass
            Path(self.tmp).unlink(missing_ok=True)
            self.f = None


class _Progress:
    """A rich progress bar in bytes with bytes/s, or nothing (small corpora, tests)."""

    def __init__(self, show: bool, total: int, done: int, name: str):
        self.show, self.total, self.done, self.name = show, total, done, name
        self._bar = None

    def __enter__(self):
        if self.show:
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)

            self._bar = Progress(TextColumn("tokenizing"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                 TimeRemainingColumn(), console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task("tokenize", total=self.total, completed=self.done)
        return self

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()


# --------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------
class TokenStream:
    """The shards' ids as one read-only 1-D array: ``len``, ``stream[a:b]`` (an ndarray, may cross shards),
    ``stream[i]``, ``view(a, b)`` (a TokenStream over a range, no copy) and ``np.asarray(stream)`` (the whole
    range, for small corpora and tests). Shards are memory-mapped on first read, per process."""

    def __init__(self, paths: list[Path], counts: list[int], dtype, start: int = 0, stop: int | None = None):
        self.paths, self.counts, self.dtype = [Path(p) for p in paths], list(counts), np.dtype(dtype)
        self._cum = np.concatenate([[0], np.cumsum(self.counts, dtype=np.int64)])
        n = int(self._cum[-1])
        self.start, self.stop = start, n if stop is None else stop
        if not 0 <= self.start <= self.stop <= n:
            raise ValueError(f"range [{start}, {stop}) outside [0, {n}]")
        self._maps: list[np.memmap | None] = [None] * len(self.paths)

    @classmethod
    def open(cls, out_dir: str | os.PathLike, manifest: dict | None = None) -> TokenStream:
        out_dir = Path(out_dir)
        manifest = manifest or read_manifest(out_dir)
        if manifest is None or not manifest.get("complete"):
            raise FileNotFoundError(f"no complete token shards in {out_dir}")
        shards = manifest["shards"]
        return cls([out_dir / s["file"] for s in shards], [s["tokens"] for s in shards], manifest["dtype"])

    def __len__(self) -> int:
        return self.stop - self.start

    def view(self, start: int, stop: int) -> TokenStream:
        if not 0 <= start <= stop <= len(self):
            raise ValueError(f"view [{start}, {stop}) outside [0, {len(self)}]")
        out = TokenStream.__new__(TokenStream)
        out.__dict__.update(self.__dict__)
        out.start, out.stop = self.start + start, self.start + stop
        return out  # shares the memory maps

    def _map(self, k: int) -> np.memmap:
        m = self._maps[k]
        if m is None:
            m = np.memmap(self.paths[k], dtype=self.dtype.newbyteorder("<"), mode="r", shape=(self.counts[k],))
            self._maps[k] = m
        return m

    def _read(self, a: int, b: int) -> np.ndarray:
        """Ids ``[a, b)`` of the whole stream (absolute positions)."""
        if a >= b:
            return np.empty(0, dtype=self.dtype)
        k = int(np.searchsorted(self._cum, a, side="right")) - 1
        parts = []
        while a < b:
            lo, hi = int(self._cum[k]), int(self._cum[k + 1])
            take = min(b, hi)
            parts.append(self._map(k)[a - lo : take - lo])
            a, k = take, k + 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __getitem__(self, key):
        if isinstance(key, slice):
            a, b, step = key.indices(len(self))
            if step != 1:
                raise ValueError("TokenStream slices take step 1")
            return self._read(self.start + a, self.start + max(a, b))
        i = int(key)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(key)
        return self._read(self.start + i, self.start + i + 1)[0]

    def __array__(self, dtype=None, copy=None):
        out = self._read(self.start, self.stop)
        return np.array(out, dtype=dtype) if dtype is not None else np.array(out)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_maps"] = [None] * len(self.paths)  # a worker or rank maps the files itself, never gets the data
        return state

    def __repr__(self) -> str:
        return f"TokenStream({len(self)} tokens, {len(self.paths)} shard(s), {self.dtype})"
