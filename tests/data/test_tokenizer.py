"""Byte-level BPE: exact round trips, fixed special ids, serialization and the disk cache."""

import random
import subprocess
import sys

import pytest
from helpers import run_cli

import attnlab.data.tokenizer as tokmod
from attnlab.data.corpus import pydoc_text
from attnlab.data.tokenizer import BPETokenizer, bpe_cache_path, train_or_load_bpe

VOCAB = 512


@pytest.fixture(scope="module")
def text():
    return pydoc_text()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def tok(text, cache_dir):
    return train_or_load_bpe(text, VOCAB, cache_dir)


def test_special_ids_and_vocab_size(tok):
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert [tok.id_to_token(i) for i in range(4)] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert 4 + 256 < tok.vocab_size <= VOCAB


def test_roundtrip_on_pydoc_samples(tok, text):
    for start in range(0, len(text) - 2000, len(text) // 7):
        sample = text[start : start + 2000]
        ids = tok.encode(sample)
        assert len(ids) < len(sample)  # merges were learnt
        assert tok.decode(ids) == sample


@pytest.mark.parametrize(
    "s",
    [
        "",
        "  leading and trailing spaces  ",
        "tabs\tand\r\nwindows newlines\n\n\n",
        "ünïcödé — 日本語 — emoji 🤖👍🏽 — zero\u200bwidth",
        "literal specials <pad><bos> <eos> <unk> stay text",
        "\x00\x01 control bytes \x7f",
    ],
)
def test_roundtrip_any_text(tok, s):
    ids = tok.encode(s)
    assert all(i > tok.unk_id for i in ids)  # never a special id, never <unk>
    assert tok.decode(ids) == s


def test_encode_adds_no_markers_and_decode_skips_specials(tok):
    ids = tok.encode("hello world")
    assert tok.encode_batch(["hello world", "x"]) == [ids, tok.encode("x")]
    wrapped = [tok.bos_id, *ids, tok.eos_id, tok.pad_id]
    assert tok.decode(wrapped) == "hello world"
    assert tok.decode(wrapped, skip_special=False) == "<bos>hello world<eos><pad>"


def test_to_str_from_str_and_save_load_give_same_ids(tok, text, tmp_path):
    sample = text[10_000:12_000] + " 🤖 <eos>"
    clone = BPETokenizer.from_str(tok.to_str())
    assert clone.encode(sample) == tok.encode(sample)
    assert clone.vocab_size == tok.vocab_size
    tok.save(tmp_path / "t.json")
    loaded = BPETokenizer.load(tmp_path / "t.json")
    assert loaded.encode(sample) == tok.encode(sample)
    assert loaded.decode(loaded.encode(sample)) == sample


def test_id_to_token_is_readable(tok):
    (the,) = tok.encode(" the")  # a single merged token
    assert tok.id_to_token(the) == "▁the"
    assert tok.id_to_token(tok.encode("\n")[0]) == "\\n"
    labels = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    assert all(isinstance(t, str) and t for t in labels)
    assert not any("Ġ" in t for t in labels)
    with pytest.raises(IndexError):
        tok.id_to_token(tok.vocab_size)


def test_cache_hit_does_not_retrain(tok, text, cache_dir, monkeypatch):
    path = bpe_cache_path(text, VOCAB, cache_dir)
    assert path.is_file() and path.parent == cache_dir / "tokenizers"
    assert path.name.startswith(f"bpe-{VOCAB}-") and path.suffix == ".json"
    mtime = path.stat().st_mtime_ns

    def boom(*a, **k):
        raise AssertionError("retrained on a cache hit")

    monkeypatch.setattr(tokmod, "train_bpe", boom)
    again = train_or_load_bpe(text, VOCAB, cache_dir)
    assert again.to_str() == tok.to_str()
    assert path.stat().st_mtime_ns == mtime
    # only the final file and its record are left: the atomic writes cleaned up their temp files
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".sha256"]


def test_cache_key_depends_on_text_and_vocab(text, tmp_path):
    a = bpe_cache_path(text, VOCAB, tmp_path)
    assert a == bpe_cache_path(text, VOCAB, tmp_path)
    assert a != bpe_cache_path(text, VOCAB + 1, tmp_path)
    assert a != bpe_cache_path(text + ".", VOCAB, tmp_path)


def test_small_text_and_training_is_deterministic(tmp_path):
    small = "the cat sat on the mat. " * 50
    t1 = train_or_load_bpe(small, 300, tmp_path / "a")
    t2 = train_or_load_bpe(small, 300, tmp_path / "b")
    assert t1.to_str() == t2.to_str()
    assert t1.vocab_size <= 300


def test_too_small_vocab_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="vocab_size must be >= 260"):
        train_or_load_bpe("abc", 100, tmp_path)


# A 5 MB "word" (no space): BPE training is quadratic in a word's length, so before pre-tokenization cut long runs
# this took > 5 min with no message. Run in a subprocess so that a regression fails the test instead of hanging it.
LONG_WORD_SCRIPT = """
import random, time
from attnlab.data.tokenizer import MAX_RUN_CHARS, BPETokenizer, train_bpe
random.seed(0)
word = "".join(random.choices("abcdefghijklmnopqrstuvwxyz", k=1000)) * 5000
text = "an ordinary line of text.\\n" * 100 + word + "\\n"
start = time.perf_counter()
tok = BPETokenizer.from_str(train_bpe(text, 512).to_str())
piece = word[:100_000]
ids = tok.encode(piece)
assert tok.decode(ids) == piece
assert max(len(tok.decode([i])) for i in set(ids)) <= MAX_RUN_CHARS
print(f"ok {time.perf_counter() - start:.1f}")
"""


def test_a_5mb_word_trains_in_seconds():
    proc = subprocess.run([sys.executable, "-c", LONG_WORD_SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("ok "), proc.stderr[-2000:]


@pytest.mark.slow  # the 10-minute budget
def test_train_py_on_a_text_file_with_a_long_word(tmp_path, cache_dir):
    """The same through the entry point: a text file whose middle is a 500 kB run without spaces (a pasted blob)."""
    blob = "".join(random.Random(1).choices("abcdefghijklmnopqrstuvwxyz0123456789+/", k=997)) * 500
    path = tmp_path / "book.txt"
    path.write_text(pydoc_text()[:50_000] + blob + "\n" + pydoc_text()[50_000:100_000], encoding="utf-8")
    proc = run_cli(["model=causal_lm", "data=text_file", f"data.path={path}", "debug=fast", "logger=csv",
                    "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false",
                    f"hydra.run.dir={tmp_path / 'run'}"], cache_dir=cache_dir, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
