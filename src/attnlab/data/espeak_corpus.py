"""An offline speech corpus: sentences spoken by eSpeak NG, written once as an LJSpeech folder under the cache.

Sentences (deterministic for ``seed``):

* number words (``num2words``, as in the translation data): distinct integers with 1..``max_digits`` digits (the
  digit count uniform, then the number uniform; short numbers are few, so most are long), e.g. "three hundred and
  forty-two"; commas dropped;
* with ``pydoc_fraction`` > 0, that share of the corpus are sentences of the language model's corpus (CPython's
  pydoc help texts) of at most ``max_chars`` characters whose every character is in the model's alphabet.

Folder: ``<cache_dir>/espeak/<key>/`` (``metadata.csv``, ``wavs/``), the key hashing every setting and the
espeakng-loader version, so changing one makes a new corpus and never mixes two.
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from .characters import CharVocab, normalize_text
from .ljspeech import METADATA, write_ljspeech

FORMAT_VERSION = "espeak-v1"


def number_sentence(n: int) -> str:
    from num2words import num2words

    return num2words(n, lang="en").replace(",", "")


def pydoc_sentences(max_chars: int, min_chars: int = 12) -> list[str]:
    """Short sentences of CPython's pydoc texts, normalized, deduplicated, in a fixed order."""
    from .corpus import pydoc_text

    vocab = CharVocab()
    text = re.sub(r"\s+", " ", pydoc_text())
    seen, out = set(), []
    for s in re.split(r"(?<=[.!?])\s+", text):
        s = normalize_text(s)
        if min_chars <= len(s) <= max_chars and vocab.covers(s) and "|" not in s and s not in seen \
                and re.search(r"[a-z]{3}", s) and not re.search(r"[()\"]|\.\w", s):  # prose, not code
            seen.add(s)
            out.append(s)
    return out


def corpus_sentences(num_utterances: int, seed: int = 0, max_digits: int = 4, pydoc_fraction: float = 0.0,
                     max_chars: int = 60) -> list[str]:
    if num_utterances < 1:
        raise ValueError(f"num_utterances must be >= 1, got {num_utterances}")
    if not 0.0 <= pydoc_fraction <= 1.0:
        raise ValueError(f"pydoc_fraction must be in [0, 1], got {pydoc_fraction}")
    rng = np.random.default_rng(seed)
    n_pydoc = int(round(num_utterances * pydoc_fraction))
    sentences: list[str] = []
    if n_pydoc:
        pool = pydoc_sentences(max_chars)
        take = rng.choice(len(pool), size=min(n_pydoc, len(pool)), replace=False)
        sentences += [pool[i] for i in sorted(take)]
    n_numbers = num_utterances - len(sentences)
    if n_numbers > 10**max_digits:
        raise ValueError(f"{n_numbers} distinct numbers asked for, but only {10**max_digits} have at most "
                         f"{max_digits} digits; raise max_digits")
    numbers: set[int] = set()
    while len(numbers) < n_numbers:  # distinct, so no validation sentence is also a training sentence
        digits = int(rng.integers(1, max_digits + 1))
        low = 0 if digits == 1 else 10 ** (digits - 1)
        numbers.add(int(rng.integers(low, 10**digits)))
    sentences += [number_sentence(n) for n in sorted(numbers)]
    order = rng.permutation(len(sentences))
    return [sentences[i] for i in order]


def corpus_key(**settings) -> str:
    try:
        loader = version("espeakng-loader")
    except PackageNotFoundError:
        loader = "unknown"
    blob = json.dumps({"format": FORMAT_VERSION, "espeakng_loader": loader, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_espeak_corpus(cache_dir: str | Path, num_utterances: int, seed: int = 0, max_digits: int = 4,
                         pydoc_fraction: float = 0.0, max_chars: int = 60, voice: str = "en-us", rate: int = 175,
                         log=print) -> Path:
    """The corpus folder, synthesized on first use (~10 ms per utterance) and reused afterwards."""
    settings = dict(num_utterances=num_utterances, seed=seed, max_digits=max_digits, pydoc_fraction=pydoc_fraction,
                    max_chars=max_chars, voice=voice, rate=rate)
    folder = Path(cache_dir) / "espeak" / corpus_key(**settings)
    if (folder / METADATA).is_file():
        return folder
    from ..audio.espeak import ESpeak

    engine = ESpeak.get()
    sentences = corpus_sentences(num_utterances, seed, max_digits, pydoc_fraction, max_chars)
    log(f"synthesizing {len(sentences)} utterances with eSpeak NG ({voice}, {rate} wpm) into {folder}")
    items = [(f"ESPEAK-{i:05d}", s, engine.synthesize(s, voice=voice, rate=rate)) for i, s in enumerate(sentences)]
    return write_ljspeech(folder, items, engine.sample_rate)
