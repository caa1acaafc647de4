"""Number-word translation data: exact num2words text, deterministic disjoint splits, buckets, cache, copy names."""

from collections import Counter

import pytest
from num2words import num2words

import attnlab.data.numbers as nummod
from attnlab.data.numbers import (
    HELD_OUT_NAMES,
    TRAIN_NAMES,
    allocate,
    digit_range,
    english_words,
    generate_numbers,
    load_or_generate_numbers,
    target_words,
)

SIZES = dict(train_size=700, val_size=120, test_size=120)


@pytest.fixture(scope="module")
def splits():
    return generate_numbers(seed=3, copy_names=True, copy_test_size=80, **SIZES)


@pytest.mark.parametrize(
    "n,en,fr,de",
    [
        (0, "zero", "zéro", "null"),
        (21, "twenty-one", "vingt et un", "einundzwanzig"),
        (71, "seventy-one", "soixante et onze", "einundsiebzig"),
        (80, "eighty", "quatre-vingts", "achtzig"),
        (81, "eighty-one", "quatre-vingt-un", "einundachtzig"),
        (200, "two hundred", "deux cents", "zweihundert"),
        (1001, "one thousand and one", "mille un", "eintausendeins"),
    ],
)
def test_known_values_match_num2words(n, en, fr, de):
    assert english_words(n) == en
    assert target_words(n, "fr") == fr == num2words(n, lang="fr")
    assert target_words(n, "de") == de == num2words(n, lang="de")


def test_english_side_drops_commas_only():
    n = 1_234_567
    assert num2words(n, lang="en").count(",") == 2
    assert english_words(n) == num2words(n, lang="en").replace(",", "")
    assert english_words(n) == english_words(n).lower() and "-" in english_words(n)


def test_every_pair_is_num2words_of_its_integer(splits):
    for name in ("train", "val", "test"):
        for p in splits[name]:
            if p.name is None:
                assert p.src == english_words(p.n) and p.tgt == num2words(p.n, lang="fr")
            else:  # copy pair: the name and the number words, in a template
                assert p.name in p.src and p.name in p.tgt
                assert english_words(p.n) in p.src and num2words(p.n, lang="fr") in p.tgt


def test_sizes_disjoint_splits_and_distinct_integers(splits):
    ints = {s: [p.n for p in splits[s] if p.name is None] for s in ("train", "val", "test")}
    assert {s: len(v) for s, v in ints.items()} == {"train": 700, "val": 120, "test": 120}
    for v in ints.values():
        assert len(set(v)) == len(v)
    assert not set(ints["train"]) & set(ints["val"])
    assert not set(ints["train"]) & set(ints["test"])
    assert not set(ints["val"]) & set(ints["test"])
    assert all(0 <= n < 10**7 for v in ints.values() for n in v)


def test_deterministic_per_seed_and_different_across_seeds():
    a = generate_numbers(seed=0, **SIZES)
    assert generate_numbers(seed=0, **SIZES) == a
    b = generate_numbers(seed=1, **SIZES)
    for s in ("train", "val", "test"):
        assert [p.n for p in a[s]] != [p.n for p in b[s]]


def test_lengths_span_every_bucket_in_every_split(splits):
    for name in ("train", "val", "test"):
        counts = Counter(p.bucket for p in splits[name] if p.name is None)
        assert sorted(counts) == [0, 1, 2, 3], (name, counts)
    # digit lengths whose pools are large enough get equal shares
    digits = Counter(len(str(p.n)) for p in splits["train"] if p.name is None)
    assert len({digits[d] for d in (4, 5, 6, 7)}) <= 2 and min(digits[d] for d in (4, 5, 6, 7)) >= 100


def test_allocation_of_small_digit_pools():
    counts = allocate({"train": 20000, "val": 1000, "test": 1000}, 7)
    assert {s: sum(c) for s, c in counts.items()} == {"train": 20000, "val": 1000, "test": 1000}
    for d in (1, 2, 3):  # every 1-3 digit integer is used; val/test get a tenth each
        lo, hi = digit_range(d)
        assert sum(c[d - 1] for c in counts.values()) == hi - lo
        assert counts["val"][d - 1] == counts["test"][d - 1] == max(1, (hi - lo) // 10)
    assert counts["train"][3:] == [4800] * 4
    with pytest.raises(ValueError, match="cannot draw 200 distinct integers with at most 2 digits"):
        allocate({"train": 100, "val": 50, "test": 50}, 2)


def test_german_target():
    s = generate_numbers(target_lang="de", seed=0, train_size=50, val_size=10, test_size=10)
    assert all(p.tgt == num2words(p.n, lang="de") for p in s["train"])
    with pytest.raises(ValueError, match="unknown target_lang 'es'; valid: fr, de"):
        generate_numbers(target_lang="es")


def test_copy_names_never_in_training(splits):
    assert not set(TRAIN_NAMES) & set(HELD_OUT_NAMES)
    assert set("".join(HELD_OUT_NAMES)) <= set("".join(TRAIN_NAMES))  # no unseen character
    train_val = [p for s in ("train", "val") for p in splits[s]]
    assert {p.name for p in train_val if p.name} <= set(TRAIN_NAMES)
    assert 0 < sum(p.name is not None for p in splits["train"]) == round(0.1 * 700)
    texts = " ".join(f"{p.src} {p.tgt}" for p in train_val)
    assert not any(name in texts for name in HELD_OUT_NAMES)
    copy = splits["copy_test"]
    assert len(copy) == 80 and all(p.name in HELD_OUT_NAMES for p in copy)
    assert len({p.name for p in copy}) > 10
    train_ints = {p.n for p in splits["train"]}
    assert all(p.n in train_ints for p in copy)  # the integer is known: only the name is new
    for p in copy:  # the name appears verbatim on both sides
        assert p.src.split()[0] == p.tgt.split()[0] == p.name or p.src.split()[-1] == p.tgt.split()[-1] == p.name


def test_cache_written_once_and_reused(tmp_path, monkeypatch):
    kw = dict(seed=5, max_digits=4, train_size=60, val_size=10, test_size=10, copy_names=True, copy_test_size=5)
    first, directory = load_or_generate_numbers(tmp_path, **kw)
    assert directory.parent == tmp_path / "numbers"
    names = sorted(p.name for p in (tmp_path / "numbers").iterdir())
    assert names == [directory.name]  # no temporary directory left behind
    files = sorted(directory.iterdir())
    assert [p.name for p in files] == ["copy_test.tsv", "meta.json", "test.tsv", "train.tsv", "val.tsv"]
    assert (directory / "train.tsv").read_text(encoding="utf-8").startswith("src\ttgt\tn\tbucket\tname\n")
    mtimes = [p.stat().st_mtime_ns for p in files]
    fresh = generate_numbers(**kw)  # the files hold exactly what generation gives
    assert {s: [(p.src, p.tgt, p.n, p.bucket, p.name) for p in v] for s, v in first.items()} == {
        s: [(p.src, p.tgt, p.n, p.bucket, p.name) for p in v] for s, v in fresh.items()}
    monkeypatch.setattr(nummod, "generate_numbers", lambda **k: pytest.fail("regenerated"))
    again, same = load_or_generate_numbers(tmp_path, **kw)
    assert same == directory and again == first
    assert [p.stat().st_mtime_ns for p in files] == mtimes


def test_cache_key_depends_on_every_parameter(tmp_path):
    base = dict(seed=0, max_digits=3, train_size=30, val_size=5, test_size=5)
    _, d0 = load_or_generate_numbers(tmp_path, **base)
    for change in (dict(seed=1), dict(target_lang="de"), dict(max_digits=4), dict(train_size=31),
                   dict(copy_names=True), dict(bucket_edges=(2, 4, 8))):  # fmt: skip
        _, d = load_or_generate_numbers(tmp_path, **{**base, **change})
        assert d != d0, change
    assert d0.name.startswith("fr-")


@pytest.mark.parametrize("sizes", [(20000, 1000, 1000), (50, 20, 20), (8, 1, 1)])
def test_zero_is_always_in_the_training_split(sizes):
    """Zero's word is part of no other number: every seed's training split has it, the splits keep their sizes and
    stay disjoint (with seed 42, the default job's, it used to be drawn into the test split)."""
    train, val, test = sizes
    for seed in range(40):
        ints = nummod.draw_integers({"train": train, "val": val, "test": test}, 7, seed)
        assert 0 in ints["train"], seed
        assert [len(ints[s]) for s in ("train", "val", "test")] == list(sizes)
        assert len(set(ints["train"]) | set(ints["val"]) | set(ints["test"])) == train + val + test
