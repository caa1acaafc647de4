"""Text normalization: every surface form of a number reaches the model as the training form, through the tokenizer a
checkpoint stores (after to_str/from_str); targets stay verbatim; old tokenizers without a normalizer still work."""

import itertools
import json
import logging

import numpy as np
import pytest
from helpers import run_cli
from num2words import num2words

import attnlab.data.tokenizer as tokmod
from attnlab.data.characters import CharVocab, normalize_text
from attnlab.data.normalization import TextNormalization, corpus_lower_words
from attnlab.data.numbers import HELD_OUT_NAMES, english_words, target_words
from attnlab.data.tokenizer import BPETokenizer, bpe_cache_path, train_or_load_bpe
from attnlab.data.translation_datamodule import TranslationDataModule, encode_sources
from attnlab.core.errors import ConfigError

SMALL = dict(train_size=600, val_size=80, test_size=80, vocab_size=1024, seq_len=64, seed=0)


def surface_forms(n: int) -> dict[str, str]:
    """How a person (or num2words itself) may write the source of ``n``; all must read as ``english_words(n)``."""
    plain = english_words(n)
    return {
        "num2words": num2words(n, lang="en"),  # with its commas: "one million, two hundred"
        "capitalized": plain[0].upper() + plain[1:],
        "title": plain.title(),  # "Twenty-One"
        "upper": plain.upper(),
        "double_spaces": plain.replace(" ", "  "),
        "padded": f"  {plain}\t ",
        "spaced_compounds": plain.replace("-", " "),  # "twenty one"
        "title_spaced_compounds": plain.replace("-", " ").title() + ".",  # "Seventy Seven."
        "period": plain + ".",
        "question": plain + " ?",
        "commas_upper_period": num2words(n, lang="en").upper() + ".",
        # full-width letters and hyphen (an East Asian keyboard): NFKC maps them to ASCII
        "fullwidth": "".join(chr(ord(c) + 0xFEE0) if c.isalpha() or c == "-" else c for c in plain.upper()),
    }


@pytest.fixture(scope="module")
def dm(cache_dir):
    """The numbers data with copy pairs: names must keep their case while number words are folded."""
    dm = TranslationDataModule(cache_dir=str(cache_dir), copy_names=True, copy_test_size=40, **SMALL)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.fixture(scope="module")
def saved(dm):
    """The tokenizer as a checkpoint carries it: a JSON string, read back."""
    return BPETokenizer.from_str(dm.tokenizer.to_str())


def test_the_checkpoint_tokenizer_stores_the_declared_normalizer(dm):
    stored = json.loads(dm.tokenizer.to_str())["normalizer"]
    assert stored["type"] == "Sequence"
    kinds = [step["type"] for step in stored["normalizers"]]
    assert kinds[:4] == ["NFKC", "Replace", "Replace", "Strip"]  # unicode, remove, whitespace (collapse + strip)
    folded = {step["content"] for step in stored["normalizers"][4:]}  # the case of the corpus' number words
    assert {"one", "hundred", "thousand", "million", "and", "twenty", "has", "for"} <= folded
    assert not folded & {"alice", "bruno"}  # names are no number words: they keep their case


def test_every_surface_form_of_generated_numbers_encodes_as_the_training_form(saved):
    rng = np.random.default_rng(7)
    numbers = [0, 7, 21, 100, 101, 1000, 1_000_000, 1_234_567, 9_999_999]  # max_digits=7: words up to "million"
    numbers += [int(10 ** rng.uniform(0, 7)) for _ in range(150)]
    for n in numbers:
        plain = english_words(n)
        ids = saved.encode(plain)
        assert saved.normalize(plain) == plain  # the training form is a fixed point
        for form, text in surface_forms(n).items():
            assert saved.normalize(text) == plain, (n, form, text)
            assert saved.encode(text) == ids, (n, form, text)


def test_encode_sources_the_path_translate_uses_pads_variants_identically(saved):
    plain = [english_words(n) for n in (5, 21, 305, 1_000_021)]
    variants = [surface_forms(n)[form] for n, form in zip((5, 21, 305, 1_000_021),
                                                          ("upper", "capitalized", "num2words", "period"))]
    src, mask = encode_sources(saved, plain)
    src_v, mask_v = encode_sources(saved, variants)
    assert src.equal(src_v) and mask.equal(mask_v)


def test_names_keep_their_case_and_number_words_fold_around_them(saved):
    name = HELD_OUT_NAMES[0]
    assert saved.normalize(f"{name} has Twenty-One.") == f"{name} has twenty-one"
    assert saved.normalize(f"{name.upper()} HAS TWENTY-ONE") == f"{name.upper()} has twenty-one"
    assert saved.normalize("someone Ones") == "someone Ones"  # whole words only


def test_targets_are_encoded_verbatim_and_decode_to_the_exact_reference(saved):
    """Source-side only: German targets have capitals ("eine Million") that a source normalization would fold."""
    for lang in ("fr", "de"):
        for n in (0, 21, 80, 71, 1_000_000, 2_000_001, 1_234_567):
            t = target_words(n, lang)
            assert saved.decode(saved.encode(t, normalize=False)) == t
    assert saved.normalize("eine Million") == "eine million"  # why targets must not go through it
    assert saved.decode(saved.encode("Eine  Million, bitte.", normalize=False)) == "Eine  Million, bitte."


def test_legacy_tokenizer_without_normalizer_encodes_as_typed_and_warns_once(saved, caplog, monkeypatch):
    data = json.loads(saved.to_str())
    data["normalizer"] = None  # what a checkpoint saved before normalization existed holds
    old_json = json.dumps(data)
    monkeypatch.setattr(tokmod, "_warned_unnormalized", False)
    with caplog.at_level(logging.WARNING, logger="attnlab.data.tokenizer"):
        old = BPETokenizer.from_str(old_json)
        BPETokenizer.from_str(old_json)
    warnings = [r for r in caplog.records if "without a text normalizer" in r.getMessage()]
    assert len(warnings) == 1 and not old.normalized
    assert old.encode("three hundred and five") == saved.encode("three hundred and five")  # the training form
    assert old.encode("Three hundred and five") != saved.encode("Three hundred and five")  # as typed
    assert old.encode("Three", normalize=False) == old.encode("Three")
    assert old.decode(old.encode("Three  Hundred.")) == "Three  Hundred."


def test_cache_key_includes_the_normalizer(tmp_path):
    text = "one two three\nun deux trois\n" * 50
    plain = TextNormalization().normalizer()
    lower = TextNormalization(case="lower").normalizer()
    paths = {bpe_cache_path(text, 300, tmp_path, n) for n in (None, plain, lower)}
    assert len(paths) == 3
    a = train_or_load_bpe(text, 300, tmp_path, plain)
    b = train_or_load_bpe(text, 300, tmp_path, lower)  # not the cached `a`
    assert a.encode("ONE") != b.encode("ONE") and b.encode("ONE") == b.encode("one")
    assert len(list((tmp_path / "tokenizers").glob("*.json"))) == 2


def test_fr_numbers_targets_would_survive_normalization_but_de_would_not():
    """Documents the choice in translation_datamodule: a joint normalizer on both sides breaks German."""
    spec = TextNormalization(unicode="NFKC", remove=",.;:!?", whitespace=True, case="lower").normalizer()
    fr = [target_words(n, "fr") for n in range(0, 3000, 7)]
    de = [target_words(n, "de") for n in (1_000_000, 2_000_000)]
    assert all(spec.normalize_str(t) == t for t in fr)
    assert all(spec.normalize_str(t) != t for t in de)


def test_corpus_lower_words():
    assert corpus_lower_words(["Alice has twenty-one", "one for Bruno", "and And"]) == ["for", "has", "one",
                                                                                        "twenty"]


def test_replace_joins_spoken_compounds_and_the_config_says_what_the_code_does():
    """`replace` pairs (regex, literal text) run last; data=numbers's YAML and the code's default are one spec."""
    from omegaconf import OmegaConf

    from attnlab.data.translation_datamodule import DEFAULT_NORMALIZATION
    from attnlab.core.paths import ROOT

    yaml_spec = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "data" / "numbers.yaml").normalize)
    assert TextNormalization.from_config(yaml_spec) == TextNormalization.from_config(DEFAULT_NORMALIZATION["numbers"])
    spec = TextNormalization.from_config(DEFAULT_NORMALIZATION["numbers"])
    norm = spec.normalizer(["twenty-one", "ninety-nine thousand", "one", "seven"])
    assert norm.normalize_str("Twenty  One, ninety nine thousand") == "twenty-one ninety-nine thousand"
    assert norm.normalize_str("plenty one twentyone") == "plenty one twentyone"  # whole words only
    as_list = TextNormalization.from_config({"replace": [["a+", "b"]]})
    assert as_list == TextNormalization.from_config({"replace": {"a+": "b"}}) and as_list.as_dict()["replace"] == [["a+", "b"]]
    assert "replace" not in TextNormalization().as_dict()  # a spec without one keeps its cache keys


@pytest.mark.parametrize("cfg, message", [
    ({"replace": {"(unclosed": "x"}}, "data.normalize.replace: '(unclosed' is not a regular expression tokenizers can use"),
    ({"replace": ["a", "b"]}, "data.normalize.replace must map regular expressions to replacement text"),
    ({"case": "upper"}, "data.normalize.case='upper' is not one of keep, lower, corpus_words"),
    ({"unicode": "NFD"}, "data.normalize.unicode='NFD' is not one of null, NFC, NFKC"),
    ({"strip": True}, "data.normalize: unknown key(s) strip"),
    ({"whitespace": "yes"}, "data.normalize.whitespace must be true or false"),
])  # fmt: skip
def test_bad_normalize_config_is_a_config_error(cfg, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TextNormalization.from_config(cfg)


@pytest.mark.slow  # the suite's 10-minute budget: the value check itself runs in-process
def test_train_py_names_a_bad_normalize_value_in_one_line(tmp_path, cache_dir):
    proc = run_cli(["data.normalize.case=upper", f"hydra.run.dir={tmp_path}"], cache_dir=cache_dir, timeout=180)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    lines = [x for x in proc.stdout.splitlines() if "data.normalize.case='upper'" in x]
    assert len(lines) == 1 and "keep, lower, corpus_words" in lines[0], proc.stdout[-3000:]


def test_corpus_words_on_an_open_vocabulary_is_refused():
    words = ["".join(p) for p in itertools.product("abcdefghijklm", repeat=3)]  # 2197 words
    with pytest.raises(ConfigError, match="has 2197 lower-case words .at most 2000.: use case=lower or case=keep"):
        TextNormalization(case="corpus_words").normalizer([" ".join(words)])


def test_tts_reads_text_through_one_normalization():
    """Training (CharVocab.encode) and synthesize (normalize_text, then encode) apply the same function."""
    vocab = CharVocab()
    assert vocab.encode("  Three   HUNDRED\tand five. ") == vocab.encode("three hundred and five.")
    text = "  Three   HUNDRED\tand five. "
    assert normalize_text(normalize_text(text)) == normalize_text(text) == "three hundred and five."
