"""Byte-level BPE tokenizer (HF ``tokenizers``) with a content-addressed on-disk cache.

Byte-level means every string maps to byte symbols first, so there is no unknown
character and ``decode(encode(s)) == s`` for any text. The special tokens of the tokenizers trained here have fixed
ids (``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3) so that models, losses
(``ignore_index=pad_id``) and generation code may rely on them without a tokenizer
at hand. A model folder's tokenizer (``init_from=`` a Hugging Face GPT-2 or LLaMA) keeps its own, found by name
(:func:`attnlab.core.special_tokens.special_ids`): only the causal LM, whose data and generation read them from the
tokenizer, takes one.

Text normalization (``attnlab.data.normalization``) is the tokenizer's ``tokenizers`` normalizer, serialized with
it: ``encode`` applies it (input text: LM text and prompts, translation sources), ``encode(..., normalize=False)``
does not (translation targets, which are the exact references). A tokenizer saved before normalization existed has
no normalizer; it keeps encoding text as typed, with a warning logged once.

Pre-tokenization cuts every run of more than ``MAX_RUN_CHARS`` non-space (or space) characters into pieces of at
most that length before the byte-level split: BPE training is quadratic in the length of a word, and one
multi-megabyte "word" (a base64 blob, a minified file) made it hang; no token can be longer than a piece.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from ..files.atomic import write_atomic
from attnlab.data.normalization import normalizer_json
from ..core.errors import ConfigError
from ..core.special_tokens import (BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID,  # noqa: F401  (data's users
                                   END_NAMES, is_own, special_ids)  # read them here)

log = logging.getLogger(__name__)

# Bump when the training recipe changes, so that stale cached tokenizers are not reused.
# v2: runs longer than MAX_RUN_CHARS cut in pre-tokenization; a normalizer (possibly empty) always set
FORMAT_VERSION = "bpe-v2"
MAX_RUN_CHARS = 64
_warned_unnormalized = False


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes->printable-unicode table used by the ByteLevel pre-tokenizer."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class BPETokenizer:
    """Thin wrapper around ``tokenizers.Tokenizer`` with the project's conventions.

    ``encode`` adds no ``<bos>``/``<eos>``: the LM data is one flat token stream, and
    callers that want markers add ``bos_id``/``eos_id`` themselves. Literal text such as
    ``"<eos>"`` in the input is encoded as ordinary text (not the special id), so that
    the round trip holds for any string.
    """

    def __init__(self, tokenizer: Tokenizer):
        specials = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        ids = special_ids(specials)
        if ids is None:
            raise ValueError(f"the tokenizer has no end-of-text token (one of {', '.join(END_NAMES)}); its special "
                             f"tokens: {sorted(specials, key=specials.get)[:6]}")
        self.own = is_own(specials)  # this repo's special tokens (else a model folder's: their names, its ids)
        self._ids, self._special_names = ids, set(specials)
        # Not serialized by `tokenizers`, hence set on every construction.
        tokenizer.encode_special_tokens = True
        self._tok = tokenizer
        self._verbatim: Tokenizer | None = None  # the same tokenizer without its normalizer, made on first use
        if tokenizer.normalizer is None and self.own:
            _warn_unnormalized()

    # -- ids -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self._ids["pad"]

    @property
    def bos_id(self) -> int:
        return self._ids["bos"]

    @property
    def eos_id(self) -> int:
        return self._ids["eos"]

    @property
    def unk_id(self) -> int:
        return self._ids["unk"]

    # -- encode / decode ---------------------------------------------------------------
    @property
    def normalized(self) -> bool:
        """False for a tokenizer saved before normalization existed (it encodes text as typed)."""
        return self._tok.normalizer is not None

    def normalize(self, text: str) -> str:
        """The text as ``encode`` sees it (the stored normalizer applied)."""
        n = self._tok.normalizer
        return text if n is None else n.normalize_str(text)

    def encode(self, text: str, normalize: bool = True) -> list[int]:
        """Ids of ``text`` after the stored normalization; ``normalize=False`` encodes it verbatim (a translation
        target: ``decode(encode(t, normalize=False)) == t`` for any text)."""
        return self._pick(normalize).encode(text).ids

    def _pick(self, normalize: bool) -> Tokenizer:
        if normalize or self._tok.normalizer is None:
            return self._tok
        if self._verbatim is None:
            self._verbatim = Tokenizer.from_str(self._tok.to_str())
            self._verbatim.normalizer = None
            self._verbatim.encode_special_tokens = True
        return self._verbatim

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Character span ``(start, end)`` of each token of ``encode(text)`` in ``text``; a token's leading space
        is inside its span ("one million" -> (0, 3), (3, 11)). To map tokens back to words (claim E2)."""
        return [tuple(o) for o in self._tok.encode(text).offsets]

    def encode_batch(self, texts: Sequence[str], normalize: bool = True) -> list[list[int]]:
        return [e.ids for e in self._pick(normalize).encode_batch(list(texts))]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """``ids`` may be a list, a 1-D tensor or a numpy array of ints."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def id_to_token(self, i: int) -> str:
        """Readable token text for plot axes: a leading space shows as '▁', newline as '\\n'.

        Byte-level tokens are stored as GPT-2's printable stand-ins ('Ġ' = space); they are
        mapped back to bytes and decoded, with partial UTF-8 sequences shown as escapes.
        """
        tok = self._tok.id_to_token(int(i))
        if tok is None:
            raise IndexError(f"token id {i} out of range [0, {self.vocab_size})")
        table = _byte_decoder()
        if tok in self._special_names or not all(c in table for c in tok):  # (not byte-level: SentencePiece's ▁)
            return tok
        raw = bytes(table[c] for c in tok)
        s = raw.decode("utf-8", errors="backslashreplace")
        return s.replace(" ", "▁").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")

    # -- serialization -----------------------------------------------------------------
    def to_str(self) -> str:
        """JSON string; small enough to store inside a checkpoint's hyper-parameters."""
        return self._tok.to_str()

    @classmethod
    def from_str(cls, s: str) -> BPETokenizer:
        return cls(Tokenizer.from_str(s))

    def save(self, path: str | Path) -> None:
        """Atomic write, so a concurrent reader never sees a half-written file."""
        _atomic_write_text(Path(path), self.to_str())

    @classmethod
    def given(cls, path: str | Path) -> BPETokenizer:
        """The tokenizer file a run is given (``data.tokenizer``: a model folder's ``tokenizer.json``): one line
        for a missing or unreadable file, a normalizer that could grow a text without bound, or special tokens
        that are not the project's."""
        import json

        from ..core.errors import DataError
        from .normalization import growth_problem

        path = Path(path).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
            spec = json.loads(text)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise DataError(f"data.tokenizer={path}: cannot be read: {e}") from None
        if problem := growth_problem(spec.get("normalizer") if isinstance(spec, dict) else None):
            raise DataError(f"data.tokenizer={path}: {problem}")
        try:
            return cls.from_str(text)
        except Exception as e:  # noqa: BLE001 - the tokenizers library's bare Exception, our ValueError (specials)
            raise DataError(f"data.tokenizer={path}: cannot be used: {str(e).strip().splitlines()[0]}") from None

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        return cls(Tokenizer.from_file(str(path)))

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def _atomic_write_text(path: Path, text: str) -> None:
    """A temporary file renamed into place; a full disk is one line (:mod:`attnlab.files.atomic`)."""
    write_atomic(path, text)


def _warn_unnormalized() -> None:
    global _warned_unnormalized
    if not _warned_unnormalized:
        _warned_unnormalized = True
        log.warning("this tokenizer was saved without a text normalizer (before normalization was declared in "
                    "data.normalize): input is encoded exactly as typed, so case, commas or extra spaces that "
                    "training text lacked change the result; retrain to get the normalization")


def pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Runs of > MAX_RUN_CHARS non-space (or space) characters cut into pieces, then GPT-2's byte-level split."""
    n = MAX_RUN_CHARS
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(rf"\S{{{n}}}|\s{{{n}}}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])  # fmt: skip


def train_bpe(text: str, vocab_size: int, normalizer: normalizers.Normalizer | None = None) -> BPETokenizer:
    """Train a byte-level BPE with exactly ``vocab_size`` entries at most (specials included).

    ``text`` is trained on as given: where ``normalizer`` applies (all of an LM's text, a translation's sources),
    the caller passes the text already normalized. The normalizer is then stored on the tokenizer (an empty one
    when None, which marks a tokenizer that knows its normalization: "none").
    """
    return train_bpe_from_texts([text], vocab_size, normalizer)


def train_bpe_from_texts(texts: Iterable[str], vocab_size: int,
                         normalizer: normalizers.Normalizer | None = None) -> BPETokenizer:
    """:func:`train_bpe` on pieces of text consumed one by one (an iterator: never the whole corpus in memory).

    The trainer keeps word counts only. Pieces cut at line breaks with text on both sides give the very tokenizer
    that their concatenation gives (the pre-tokenizer splits at the line break anyway).
    """
    min_size = len(SPECIAL_TOKENS) + 256
    if vocab_size < min_size:
        raise ConfigError(f"data.vocab_size must be >= {min_size} (4 specials + 256 bytes), got {vocab_size}")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),  # ids 0..3 in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.normalizer = normalizer if normalizer is not None else normalizers.Sequence([])
    out = BPETokenizer(tok)
    assert out.vocab_size <= vocab_size, (out.vocab_size, vocab_size)
    return out


def bpe_cache_key(text: str, vocab_size: int, normalizer: normalizers.Normalizer | None = None) -> str:
    """sha256(version, vocab, normalizer JSON, text): what a cached tokenizer is stored under."""
    h = hashlib.sha256(f"{FORMAT_VERSION}\n{vocab_size}\n{normalizer_json(normalizer)}\n".encode())
    h.update(text.encode("utf-8"))
    return h.hexdigest()


def bpe_cache_path(text: str, vocab_size: int, cache_dir: str | Path,
                   normalizer: normalizers.Normalizer | None = None) -> Path:
    """``<cache_dir>/tokenizers/bpe-<vocab>-<key>.json`` (the key's first 16 hex digits)."""
    return cache_file(cache_dir, vocab_size, bpe_cache_key(text, vocab_size, normalizer))


def cache_file(cache_dir: str | Path, vocab_size: int, key: str) -> Path:
    return Path(cache_dir) / "tokenizers" / f"bpe-{vocab_size}-{key[:16]}.json"


# ------------------------------------------------------------------------------------------------------------------
# The cache: every tokenizer file has a record beside it (``<file>.sha256``: the full key it is stored under and the
# sha256 of its content), written before the file itself. A file whose record is missing, names another key or
# another content (truncated, overwritten, swapped for another tokenizer) is rebuilt with a warning naming it.
# ------------------------------------------------------------------------------------------------------------------
def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def load_cached(path: str | Path, key: str) -> BPETokenizer | None:
    """The tokenizer cached at ``path`` if it is the one stored under ``key``; None if there is none, or (after a
    warning naming the file and what is wrong) if it is damaged or another one: the caller rebuilds it."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = path.read_bytes()
        record = json.loads(_record_path(path).read_text(encoding="utf-8"))
        if not isinstance(record, dict):
            raise ValueError
    except FileNotFoundError:
        reason = f"has no record of what it holds ({_record_path(path).name}; written by an older attnlab?)"
    except (OSError, UnicodeDecodeError, ValueError):
        reason = f"has a damaged record ({_record_path(path).name})"
    else:
        if record.get("key") != key:
            reason = f"is recorded under another key ({_record_path(path).name} says {record.get('key')!s:.16})"
        elif record.get("sha256") != hashlib.sha256(data).hexdigest():
            reason = "is not the file that was stored (truncated, overwritten or swapped: its sha256 differs)"
        else:
            try:
                return BPETokenizer.from_str(data.decode("utf-8"))
            except Exception as e:  # noqa: BLE001 - recorded but unreadable (a newer tokenizers format?)
                reason = f"does not load ({one_line(e)})"
    log.warning(f"cached tokenizer {path} {reason}: rebuilding it")
    return None


def save_cached(tok: BPETokenizer, path: str | Path, key: str) -> None:
    """Write the tokenizer and its record (first, so a reader never trusts a file without one)."""
    path = Path(path)
    text = tok.to_str()
    record = {"key": key, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
    _atomic_write_text(_record_path(path), json.dumps(record))
    _atomic_write_text(path, text)


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines() or [type(e).__name__])[0][:200]


def train_or_load_bpe(text: str, vocab_size: int, cache_dir: str | Path,
                      normalizer: normalizers.Normalizer | None = None) -> BPETokenizer:
    """Load the tokenizer for (text, vocab_size, normalizer) from the cache, training it only when missing.

    The file is written atomically, so DDP ranks (or parallel sweep jobs) sharing a cache
    directory either see no file (and train it themselves, with an identical result) or
    a complete one. A cached file that is not the one stored under its key is rebuilt (:func:`load_cached`).
    """
    key = bpe_cache_key(text, vocab_size, normalizer)
    path = cache_file(cache_dir, vocab_size, key)
    tok = load_cached(path, key)
    if tok is None:
        tok = train_bpe(text, vocab_size, normalizer)
        save_cached(tok, path, key)
    return tok
