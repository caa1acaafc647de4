"""The language model's corpus, without torch: the sources a data config names, where their tokenizer and token
shards are cached, and a read of their text as the shards will read it.

Torch-free: train.py reads a corpus through these functions before it imports Lightning
(:mod:`attnlab.runs.data_check`); the data module (:mod:`attnlab.data.lm_datamodule`) tokenizes it through the same.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from . import tokenizer as tokmod
from ..core.errors import ConfigError
from .corpus import pydoc_text
from .hf_source import text_column_file
from .normalization import TextNormalization
from .shards import CHUNK_BYTES, complete_manifest, shards_dir
from .text_sources import BlankCheck, TextSource, fingerprint, iter_chunks, resolve_files

SOURCES = ("pydoc", "text_file", "hf")
TOKENIZER_KEY_VERSION = "lm-stream-v1"
# The LM learns text as written: case and punctuation are content. Only the Unicode form is unified (NFC), so that
# composed and decomposed accents are the same tokens; generate's prompts get the same, through the tokenizer.
DEFAULT_NORMALIZATION = {"unicode": "NFC", "remove": "", "whitespace": False, "case": "keep"}
DEFAULT_TOKENIZER_SAMPLE_MB = 64


def lm_normalization(normalize: dict | None) -> TextNormalization:
    """``data.normalize`` of the LM's text; None: :data:`DEFAULT_NORMALIZATION`."""
    return TextNormalization.from_config(DEFAULT_NORMALIZATION if normalize is None else normalize)


def tokenizer_sample_bytes(tokenizer_sample_mb: float) -> int:
    """``data.tokenizer_sample_mb`` in bytes: how much text the tokenizer is trained on, at most."""
    return int(tokenizer_sample_mb * (1 << 20))


def text_sources(source: str, path: str | os.PathLike | None = None, hf: dict | None = None,
                 cache_dir: str | os.PathLike = ".cache") -> list[TextSource]:
    """The sources of a data source (see ``SOURCES``): pydoc's text, the files ``path`` names, or the text column of
    a Hugging Face dataset's train split (exported once into the cache, data/hf_source.py)."""
    if source == "hf":
        return [TextSource.from_file(text_column_file(str(path), hf or {}, cache_dir))]
    if source == "pydoc":
        return [TextSource.from_text("pydoc", pydoc_text())]
    if source == "text_file":
        if not path:
            raise ConfigError("source='text_file' needs path=<a UTF-8 text file, a folder or a glob>")
        return [TextSource.from_file(p) for p in resolve_files(path)]
    raise ConfigError(f"unknown data source {source!r}; valid sources: {', '.join(SOURCES)}")


def tokenizer_cache(sources: list[TextSource], vocab_size: int, cache_dir: str | os.PathLike,
                    normalization: TextNormalization, sample_bytes: int, chunk_bytes: int) -> tuple[Path, str]:
    """The file the BPE of these sources is cached in, and the key it is stored under.

    The key hashes the sources' fingerprints (a file's path, size and mtime: no read), the normalization spec, the
    vocabulary and the sample size, so a cached tokenizer costs a few ``stat`` calls.
    """
    total = sum(s.size for s in sources)
    sample = "all" if total <= sample_bytes else f"{sample_bytes}/{chunk_bytes}"
    h = hashlib.sha256(f"{TOKENIZER_KEY_VERSION}\n{tokmod.FORMAT_VERSION}\n{vocab_size}\n{sample}\n".encode())
    h.update(json.dumps(normalization.as_dict(), sort_keys=True).encode())
    h.update(fingerprint(sources).encode())
    key = h.hexdigest()
    return tokmod.cache_file(cache_dir, vocab_size, key), key


def tokenized(sources: list[TextSource], vocab_size: int, cache_dir: str | os.PathLike,
              normalization: TextNormalization, sample_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> bool:
    """True when the data module will read none of these sources' text: their tokenizer is cached and their token
    shards are complete. (A file changed since has another size or mtime, hence another key: it is read again.)"""
    tok = tokmod.load_cached(*tokenizer_cache(sources, vocab_size, cache_dir, normalization, sample_bytes,
                                              chunk_bytes))
    return tok is not None and complete_manifest(shards_dir(sources, tok, cache_dir), sources, tok) is not None


def read_text(sources: list[TextSource], chunk_bytes: int = CHUNK_BYTES, avoid: str = "") -> None:
    """Read every byte of the sources in the chunks the token shards read (:func:`iter_chunks`): the first byte that
    is not UTF-8 is the one-line DataError naming file, line and byte offset; sources without a non-space character
    are the one line the tokenizer gives (:class:`BlankCheck`). ``avoid``: the normalization's ``remove``."""
    blank = BlankCheck(sources)
    for _ in blank.watch(iter_chunks(sources, chunk_bytes, avoid=avoid)):
        pass
    blank.raise_if_blank()
