"""English number words -> French (or German) number words, generated with ``num2words``; offline.

``21`` -> ``"twenty-one"`` -> ``"vingt et un"`` (fr) / ``"einundzwanzig"`` (de: the compound reverses the order of
units and tens, a reordering the attention has to learn). Text conventions:

* source: ``num2words(n, lang="en")`` with its commas removed ("one million, two hundred" -> "one million two
  hundred"); lower case, hyphens kept ("twenty-one"), British "and" kept ("one hundred and one").
* target: exactly ``num2words(n, lang=target_lang)`` (French "quatre-vingts", German "eine Million" unchanged).
* length bucket: number of whitespace-separated source words, a hyphenated compound counting as one word
  (``parallel.length_bucket``); with max_digits=7 the default buckets 1-3, 4-6, 7-9, 10+ are roughly 1-2, 3-5, 6
  and 7 digits.

Integers: for each split the number of digits is drawn uniformly from 1..max_digits and then a uniform integer with
that many digits (0-9 for one digit), all distinct across the three splits. Short numbers are few (10 with one digit,
90 with two, 900 with three), so where a digit length cannot fill every split's share, val and test each get at most
a tenth of those integers (at least one) and train the rest; the shortfall moves on to the longer lengths.

Copy pairs (claim E15, ``copy_names=True``): "<name> has <number>" -> "<name> a <nombre>" and "<number> for <name>"
-> "<nombre> pour <name>". Train and val copy pairs use ``TRAIN_NAMES``; the separate ``copy_test`` split uses
``HELD_OUT_NAMES``, never seen in training, with *training* integers, so the only new thing in a copy_test pair is
the name, which can only be translated by copying it.

Chunks (claim E2, ``word_chunks``): a number's words fall into magnitude groups, "one million | two hundred and
thirty-four thousand | five hundred | and sixty-seven" -> "un million | deux cent trente-quatre mille | cinq cent |
soixante-sept", and each English group translates to the French group of the same magnitude. That is a known,
coarse word alignment, against which a model's unsupervised attention can be scored.

Everything is generated once per parameter set and cached as ``<cache_dir>/numbers/<key>/{train,val,test}.tsv``
(+ ``copy_test.tsv``, ``meta.json``), the directory written atomically (``parallel.write_split_dir``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path

import numpy as np

from ..core.choices import TARGET_LANGS
from attnlab.data.parallel import (
    DEFAULT_BUCKET_EDGES,
    Pair,
    check_bucket_edges,
    length_bucket,
    pairs_from_tsv,
    pairs_to_tsv,
    write_split_dir,
)

# v2: zero is always in the training split (with seed 42, the default job's, v1 drew it into the test split)
NUMBERS_FORMAT_VERSION = "numbers-v2"
# num2words hyphenates the compounds 21-99 ("twenty-one"); people also type "twenty one". This (Oniguruma regex,
# text) pair of the source normalization (conf/data/numbers.yaml) writes the space between a tens word and a unit
# word as the hyphen.
SPOKEN_COMPOUNDS = (r"(?<=\b(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety))[ ]+"
                    r"(?=(?:one|two|three|four|five|six|seven|eight|nine)\b)", "-")
SPLITS = ("train", "val", "test")
# val and test each take at most this share of a digit length whose integers cannot fill every split's request
SMALL_POOL_EVAL_SHARE = 0.1

# Two disjoint lists of first names (ASCII). Every character of a held-out name also occurs in some training name,
# so copying a held-out name needs no byte the model never saw.
TRAIN_NAMES: tuple[str, ...] = (
    "Alice", "Bruno", "Chloe", "David", "Emma", "Felix", "Gabriel", "Hugo", "Ines", "Jules",
    "Karim", "Maya", "Manon", "Nathan", "Oscar", "Paul", "Quentin", "Rose", "Sarah", "Thomas",
    "Ursula", "Victor", "William", "Xavier", "Yasmine", "Zoe", "Adam", "Louise", "Martin", "Camille",
    "Elena", "Omar", "Nina", "Lucas", "Julia", "Marco", "Sofia", "Pierre", "Benjamin", "Philippe",
)  # fmt: skip
HELD_OUT_NAMES: tuple[str, ...] = (
    "Beatrice", "Cedric", "Dmitri", "Esther", "Fatima", "Gustave", "Helga", "Igor", "Josephine", "Kenji",
    "Ludovic", "Mireille", "Noah", "Olga", "Priya", "Rafael", "Svetlana", "Tobias", "Valentin", "Wanda",
)  # fmt: skip

# (source template, target template per language); {name} and {number} are filled in
COPY_TEMPLATES: tuple[tuple[str, dict[str, str]], ...] = (
    ("{name} has {number}", {"fr": "{name} a {number}", "de": "{name} hat {number}"}),
    ("{number} for {name}", {"fr": "{number} pour {name}", "de": "{number} für {name}"}),
)


@lru_cache(maxsize=1 << 16)
def english_words(n: int) -> str:
    """Source text of ``n``: num2words English, commas removed (21 -> 'twenty-one')."""
    from num2words import num2words

    return num2words(n, lang="en").replace(",", "")


@lru_cache(maxsize=1 << 16)
def target_words(n: int, lang: str = "fr") -> str:
    """Target text of ``n``: exactly ``num2words(n, lang=lang)`` (21 -> 'vingt et un' / 'einundzwanzig')."""
    from num2words import num2words

    if lang not in TARGET_LANGS:
        raise ValueError(f"unknown target_lang {lang!r}; valid: {', '.join(TARGET_LANGS)}")
    return num2words(n, lang=lang)


# Magnitude groups of a number's words, largest first; the last one ("rest") is what follows the last marker.
CHUNKS: tuple[str, ...] = ("billions", "millions", "thousands", "hundreds", "rest")
# The word that closes each group but the last, per language (num2words' spellings; French plurals included).
CHUNK_MARKERS: dict[str, tuple[frozenset[str], ...]] = {
    "en": (frozenset({"billion"}), frozenset({"million"}), frozenset({"thousand"}), frozenset({"hundred"})),
    "fr": (frozenset({"milliard", "milliards"}), frozenset({"million", "millions"}), frozenset({"mille"}),
           frozenset({"cent", "cents"})),
}  # fmt: skip


def word_chunks(text: str, lang: str) -> list[int]:
    """The magnitude group (an index into ``CHUNKS``) of every whitespace-separated word of a number's text.

    Scans left to right: the billions group runs up to and including "billion" / "milliard(s)", the millions
    group up to "million(s)", the thousands group up to "thousand" / "mille" (so the hundreds *of the thousands*
    belong to it: "two hundred and thirty-four thousand" is one group), the hundreds group up to the last group's
    "hundred" / "cent(s)", and every word after that is "rest" (English "and" included: "five hundred | and
    sixty-seven"). A group the number does not have is simply absent. ``lang`` is ``"en"`` (a source) or ``"fr"``
    (a target); German compounds ("zweihundertdreißig") have no word boundaries to score, so they are refused.
    For number pairs only: a copy pair's name and template words would land in some group.
    """
    if lang not in CHUNK_MARKERS:
        raise ValueError(f"word_chunks knows {', '.join(CHUNK_MARKERS)} number words, not {lang!r}")
    words = text.split()
    labels = [len(CHUNKS) - 1] * len(words)
    start = 0
    for chunk, markers in enumerate(CHUNK_MARKERS[lang]):
        end = next((j for j in range(start, len(words)) if words[j] in markers), None)
        if end is not None:
            labels[start : end + 1] = [chunk] * (end + 1 - start)
            start = end + 1
    return labels


def digit_range(d: int) -> tuple[int, int]:
    """[low, high) of the integers with ``d`` digits (0..9 for one digit)."""
    return (0 if d == 1 else 10 ** (d - 1)), 10**d


def allocate(sizes: dict[str, int], max_digits: int) -> dict[str, list[int]]:
    """How many integers of each digit length (index d-1) every split gets; sums equal ``sizes``."""
    remaining = dict(sizes)
    counts = {s: [0] * max_digits for s in sizes}
    for d in range(1, max_digits + 1):
        lo, hi = digit_range(d)
        pool = hi - lo
        left = max_digits - d + 1
        want = {s: math.ceil(r / left) for s, r in remaining.items()} if left > 1 else dict(remaining)
        if sum(want.values()) > pool:
            if left == 1:
                raise ValueError(
                    f"cannot draw {sum(sizes.values())} distinct integers with at most {max_digits} digits; "
                    "use a larger max_digits or smaller split sizes"
                )
            cap = max(1, int(SMALL_POOL_EVAL_SHARE * pool))
            got = {s: min(w, cap) for s, w in want.items() if s != "train"}
            got["train"] = min(want.get("train", 0), pool - sum(got.values()))
            want = {s: got.get(s, 0) for s in want}
        for s, w in want.items():
            counts[s][d - 1] = w
            remaining[s] -= w
    return counts


def draw_integers(sizes: dict[str, int], max_digits: int, seed: int) -> dict[str, list[int]]:
    """Distinct integers per split (digit length uniform, then uniform within it), shuffled; deterministic."""
    rng = np.random.default_rng([seed, 0])
    counts = allocate(sizes, max_digits)
    out: dict[str, list[int]] = {s: [] for s in sizes}
    for d in range(1, max_digits + 1):
        lo, hi = digit_range(d)
        k = sum(c[d - 1] for c in counts.values())
        if k == 0:
            continue
        drawn = (rng.choice(hi - lo, size=k, replace=False) + lo).tolist()
        i = 0
        for s in sizes:
            c = counts[s][d - 1]
            out[s].extend(drawn[i : i + c])
            i += c
    _zero_in_train(out)
    return {s: [out[s][j] for j in rng.permutation(len(out[s])).tolist()] for s in sizes}


def _zero_in_train(split_integers: dict[str, list[int]]) -> None:
    """Zero's word ("zero" -> "zéro", "null") is part of no other number, so a model that never trained on it cannot
    translate it: moved into the training split if drawn elsewhere, in exchange for a training integer of one digit
    (of any length if there is none), or put there in place of that integer if it was not drawn at all (small
    splits); every split keeps its size and the integers stay distinct."""
    train = split_integers.get("train")
    if not train or 0 in train:
        return
    k = next((i for i, n in enumerate(train) if n < 10), 0)
    for split, integers in split_integers.items():
        if split != "train" and 0 in integers:
            integers[integers.index(0)] = train[k]
            break
    train[k] = 0


def number_pair(n: int, lang: str, edges=DEFAULT_BUCKET_EDGES) -> Pair:
    src = english_words(n)
    return Pair(src, target_words(n, lang), bucket=length_bucket(src, edges), n=n)


def copy_pairs(
    integers: list[int], names: tuple[str, ...], count: int, lang: str, rng: np.random.Generator,
    edges=DEFAULT_BUCKET_EDGES,
) -> list[Pair]:
    """``count`` template pairs embedding a name from ``names`` and an integer from ``integers``."""
    out = []
    for _ in range(count):
        n = int(integers[int(rng.integers(len(integers)))])
        name = names[int(rng.integers(len(names)))]
        src_t, tgt_t = COPY_TEMPLATES[int(rng.integers(len(COPY_TEMPLATES)))]
        src = src_t.format(name=name, number=english_words(n))
        tgt = tgt_t[lang].format(name=name, number=target_words(n, lang))
        out.append(Pair(src, tgt, bucket=length_bucket(src, edges), n=n, name=name))
    return out


def generate_numbers(
    target_lang: str = "fr",
    max_digits: int = 7,
    train_size: int = 20000,
    val_size: int = 1000,
    test_size: int = 1000,
    seed: int = 0,
    copy_names: bool = False,
    copy_fraction: float = 0.1,
    copy_test_size: int = 500,
    bucket_edges=DEFAULT_BUCKET_EDGES,
) -> dict[str, list[Pair]]:
    """The splits (train, val, test, and copy_test when ``copy_names``), generated in memory."""
    check_numbers_args(target_lang, max_digits, train_size, val_size, test_size, copy_fraction, copy_test_size)
    edges = check_bucket_edges(bucket_edges)
    ints = draw_integers({"train": train_size, "val": val_size, "test": test_size}, max_digits, seed)
    splits = {s: [number_pair(n, target_lang, edges) for n in ints[s]] for s in SPLITS}
    if copy_names:
        rng = np.random.default_rng([seed, 1])
        for s, size in (("train", train_size), ("val", val_size)):
            extra = copy_pairs(ints[s], TRAIN_NAMES, round(copy_fraction * size), target_lang, rng, edges)
            mixed = splits[s] + extra
            splits[s] = [mixed[j] for j in rng.permutation(len(mixed)).tolist()]
        splits["copy_test"] = copy_pairs(ints["train"], HELD_OUT_NAMES, copy_test_size, target_lang, rng, edges)
    return splits


def check_numbers_args(target_lang, max_digits, train_size, val_size, test_size, copy_fraction, copy_test_size):
    if target_lang not in TARGET_LANGS:
        raise ValueError(f"unknown target_lang {target_lang!r}; valid: {', '.join(TARGET_LANGS)}")
    if not 1 <= max_digits <= 12:
        raise ValueError(f"max_digits must be in [1, 12], got {max_digits}")
    if train_size < 1 or val_size < 1 or test_size < 1:
        raise ValueError(f"train/val/test sizes must be >= 1, got {train_size}/{val_size}/{test_size}")
    if not 0 <= copy_fraction <= 1 or copy_test_size < 1:
        raise ValueError(f"copy_fraction must be in [0, 1] and copy_test_size >= 1, got {copy_fraction}, "
                         f"{copy_test_size}")


def numbers_params(target_lang, max_digits, train_size, val_size, test_size, seed, copy_names, copy_fraction,
                   copy_test_size, bucket_edges) -> dict:
    """Everything the generated files depend on (the cache key hashes it)."""
    params = {
        "format": NUMBERS_FORMAT_VERSION, "num2words": version("num2words"), "target_lang": target_lang,
        "max_digits": int(max_digits), "train_size": int(train_size), "val_size": int(val_size),
        "test_size": int(test_size), "seed": int(seed), "bucket_edges": list(check_bucket_edges(bucket_edges)),
        "copy_names": bool(copy_names),
    }  # fmt: skip
    if copy_names:
        params.update(copy_fraction=float(copy_fraction), copy_test_size=int(copy_test_size),
                      train_names=list(TRAIN_NAMES), held_out_names=list(HELD_OUT_NAMES),
                      templates=[list(t) for t in COPY_TEMPLATES])  # fmt: skip
    return params


def numbers_cache_dir(cache_dir: str | os.PathLike, params: dict) -> Path:
    """``<cache_dir>/numbers/<lang>-<sha256 of params>``."""
    h = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / "numbers" / f"{params['target_lang']}-{h}"


def load_or_generate_numbers(cache_dir: str | os.PathLike, **kwargs) -> tuple[dict[str, list[Pair]], Path]:
    """The splits and their cache directory, generating and writing them only when missing.

    ``kwargs`` are ``generate_numbers``'s (all of them matter for the key, defaults included).
    """
    full = dict(target_lang="fr", max_digits=7, train_size=20000, val_size=1000, test_size=1000, seed=0,
                copy_names=False, copy_fraction=0.1, copy_test_size=500, bucket_edges=DEFAULT_BUCKET_EDGES)
    unknown = set(kwargs) - set(full)
    if unknown:
        raise TypeError(f"unknown numbers parameters: {sorted(unknown)}")
    full.update(kwargs)
    check_numbers_args(full["target_lang"], full["max_digits"], full["train_size"], full["val_size"],
                       full["test_size"], full["copy_fraction"], full["copy_test_size"])
    params = numbers_params(**full)
    directory = numbers_cache_dir(cache_dir, params)
    names = [*SPLITS, "copy_test"] if full["copy_names"] else list(SPLITS)
    if not all((directory / f"{s}.tsv").is_file() for s in names):
        splits = generate_numbers(**full)
        files = {f"{s}.tsv": pairs_to_tsv(splits[s]) for s in names}
        files["meta.json"] = json.dumps(params, indent=1) + "\n"
        write_split_dir(directory, files)
    return {s: pairs_from_tsv(directory / f"{s}.tsv") for s in names}, directory
