"""Cached files are checked against the key they are stored under: a tokenizer (translation's and the LM's) or a
token shard that is truncated, overwritten with garbage, swapped for another one's, or missing its record is rebuilt
with a warning naming it, and the rebuilt file is the one an empty cache gives. The real cache functions that
``train.py`` calls (``train_or_load_bpe``, ``tokenize_corpus``), on small texts."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from attnlab.data.corpus import pydoc_text
from attnlab.data.lm_datamodule import tokenize_corpus
from attnlab.data.text_sources import TextSource
from attnlab.data.tokenizer import train_or_load_bpe

TEXT = pydoc_text()[:20_000]
OTHER = pydoc_text()[40_000:60_000]
DAMAGE = ["truncated", "garbage", "swapped", "record missing", "record of another key"]


def _damage(path: Path, how: str, other: Path) -> None:
    """``other``: the same kind of file stored under another key (what a swap puts in place)."""
    record, other_record = (p.with_name(p.name + ".sha256") for p in (path, other))
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))
    elif how == "swapped":
        shutil.copy(other, path)
        if other_record.is_file() and record.is_file():  # a consistent pair from another key
            shutil.copy(other_record, record)
    elif how == "record missing":
        record.unlink()
    elif how == "record of another key":
        shutil.copy(other_record, record)


def _rebuilt(caplog, path: Path) -> None:
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and str(path) in r.getMessage()]
    assert len(warnings) == 1 and "rebuil" in warnings[0], [r.getMessage() for r in caplog.records]
    caplog.clear()


def _tokenizer(kind: str, text: str, cache: Path):
    if kind == "translation":
        return train_or_load_bpe(text, 300, cache)
    return tokenize_corpus([TextSource.from_text("corpus", text)], 300, cache)[0]


def _tokens(text: str, cache: Path) -> np.ndarray:
    return np.asarray(tokenize_corpus([TextSource.from_text("corpus", text)], 300, cache)[1])


NAMES: dict[tuple[str, str], str] = {}  # (kind, text) -> the name its tokenizer is stored under


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A cache holding both texts' tokenizers (both kinds) and token shards, as an empty cache makes them."""
    cache = tmp_path_factory.mktemp("built")
    for kind in ("translation", "lm"):
        for text in (TEXT, OTHER):
            seen = set((cache / "tokenizers").glob("*.json"))
            _tokenizer(kind, text, cache)
            (new,) = set((cache / "tokenizers").glob("*.json")) - seen
            NAMES[kind, text] = new.name
    return cache


def _copy(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "cache"))


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("kind", ["translation", "lm"])
def test_a_damaged_or_swapped_tokenizer_is_rebuilt_with_a_warning(kind, how, built, tmp_path, caplog):
    cache = _copy(built, tmp_path)
    path, other = (cache / "tokenizers" / NAMES[kind, text] for text in (TEXT, OTHER))
    expected = path.read_text()
    _damage(path, how, other)
    caplog.set_level(logging.WARNING)
    assert _tokenizer(kind, TEXT, cache).to_str() == expected
    _rebuilt(caplog, path)
    assert path.read_text() == expected and _tokenizer(kind, TEXT, cache).to_str() == expected  # repaired
    assert not caplog.records


@pytest.mark.parametrize("how", ["truncated", "garbage", "swapped", "another corpus's folder"])
def test_a_damaged_or_swapped_token_shard_is_rebuilt_with_a_warning(how, built, tmp_path, caplog):
    cache = _copy(built, tmp_path)
    clean = _tokens(TEXT, cache)
    by_age = sorted((cache / "tokens").iterdir(), key=lambda d: (d / "manifest.json").stat().st_mtime)
    shard_dir = next(d for d in by_age if np.array_equal(np.fromfile(d / "shard-00000.bin", np.uint16), clean))
    (other_dir,) = [d for d in by_age if d != shard_dir]  # OTHER's
    shard = shard_dir / "shard-00000.bin"
    if how == "another corpus's folder":
        shutil.rmtree(shard_dir)
        shutil.copytree(other_dir, shard_dir)
        named = shard_dir / "manifest.json"
    else:
        if how == "swapped":  # another corpus's shard of the same size: only its content tells
            data = (other_dir / "shard-00000.bin").read_bytes()
            shard.write_bytes((data * 2)[: shard.stat().st_size])
        else:
            _damage(shard, how, other_dir / "shard-00000.bin")
        named = shard
    caplog.set_level(logging.WARNING)
    assert np.array_equal(_tokens(TEXT, cache), clean)
    _rebuilt(caplog, named)
    assert np.array_equal(_tokens(TEXT, cache), clean) and not caplog.records
