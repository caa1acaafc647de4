"""train.py's read of the data files before torch (attnlab.runs.data_check.check_data) says, for every bad file of
every data option, exactly what the data module says for the same file: both are called on it, in-process, and
their one-line refusals compared (same class, same message). That they agree on every case is what shows the rule
lives in one reader, not in two copies. Good files pass both; a file the data module never reads is never judged.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import hydra
import numpy as np
import pytest
from helpers import compose_train
from omegaconf import OmegaConf
from vision_helpers import write_tiny_cifar

import attnlab.runs.data_check as preflight
from attnlab.audio.wav import write_wav
from attnlab.data.ljspeech import write_ljspeech
from attnlab.runs.data_check import CHECKS, GENERATED, HF_TARGET, check_data
from attnlab.core.errors import UserError, find_user_error
from attnlab.core.paths import CONF_DIR

pytest.importorskip("datasets")

GOOD_PAIRS = "".join(f"sentence {w}\tphrase {w}\n" for w in "one two three four five six seven eight nine ten".split())


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    """Good and bad files of every kind each data option reads."""
    d = tmp_path_factory.mktemp("preflight")
    (d / "good.tsv").write_text(GOOD_PAIRS, encoding="utf-8")
    (d / "no_tab.tsv").write_text("Hello.\tBonjour.\nno tab here\nBye.\tSalut.\n", encoding="utf-8")
    (d / "empty.tsv").write_bytes(b"")
    (d / "latin1.tsv").write_bytes("Hi.\tSalut.\nCoffee.\tCaf\xe9.\n".encode("latin-1"))  # 0xe9 at byte offset 22
    (d / "a_folder.tsv").mkdir()
    (d / "few.tsv").write_text("Go.\tVa !\nGo.\tMarche.\n", encoding="utf-8")  # one source: no val/test split
    (d / "good.txt").write_text("The quick brown fox jumps over the lazy dog.\n" * 40, encoding="utf-8")
    (d / "blank.txt").write_bytes(b" \n\n")
    (d / "latin1.txt").write_bytes(b"fine line\n" * 3 + "caf\xe9\n".encode("latin-1"))  # 0xe9 at 33, line 4
    (d / "no_files").mkdir()
    (d / "texts").mkdir()
    (d / "texts" / "a.txt").write_text("good text\n", encoding="utf-8")
    (d / "texts" / "b.txt").write_bytes(b"\xff\xfe broken\n")
    (d / "pairs.jsonl").write_text("".join(json.dumps({"en": f"one {i}", "fr": f"un {i}", "text": f"line {i}"})
                                           + "\n" for i in range(40)))
    (d / "broken.jsonl").write_text(json.dumps({"en": "a", "fr": "b"}) + '\n{"en": \n')
    write_tiny_cifar(d / "cifar", n_per_batch=10)
    (d / "cifar_is_a_file").write_text("not a folder\n")
    for name, damage in (("cifar_missing_batch", None), ("cifar_empty_batch", b""),
                         ("cifar_garbage_batch", b"\x80\x04 not a pickle"),
                         ("cifar_no_labels", pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)}))):
        write_tiny_cifar(d / name, n_per_batch=10)
        if damage is None:
            (d / name / "data_batch_2").unlink()
        else:
            (d / name / "data_batch_3").write_bytes(damage)
    t = np.arange(11025) / 22050
    items = [(f"u{i}", f"utterance number {i}", (np.sin(2 * np.pi * 220 * (i + 1) * t) * 8000).astype(np.int16))
             for i in range(4)]
    for name in ("lj", "lj_truncated", "lj_missing_wav", "lj_rate", "lj_long_text_broken_wav", "lj_bad_line",
                 "lj_no_metadata", "lj_latin1"):
        write_ljspeech(d / name, items, 22050)
    wav = d / "lj_truncated" / "wavs" / "u1.wav"
    wav.write_bytes(wav.read_bytes()[: wav.stat().st_size // 2])
    (d / "lj_missing_wav" / "wavs" / "u2.wav").unlink()
    write_wav(d / "lj_rate" / "wavs" / "u3.wav", items[3][2], 16000)
    # an utterance longer than max_chars is left out unread: its broken WAV is no refusal, for either reader
    meta = d / "lj_long_text_broken_wav" / "metadata.csv"
    meta.write_text(meta.read_text() + f"u9|{'x' * 300}|{'x' * 300}\n")
    (d / "lj_long_text_broken_wav" / "wavs" / "u9.wav").write_bytes(b"RIFF")
    (d / "lj_bad_line" / "metadata.csv").write_text("u0|utterance number 0|utterance number 0\nno separator\n")
    (d / "lj_no_metadata" / "metadata.csv").unlink()
    (d / "lj_latin1" / "metadata.csv").write_bytes("u0|caf\xe9|caf\xe9\n".encode("latin-1"))  # 0xe9 at byte 6
    return d


# data option -> (train.py overrides, model name)
OPTIONS = {
    "tsv": (["model=transformer_mt", "data=tsv", "data.path=x"], "transformer_mt"),
    "text": (["model=causal_lm", "data=text_file", "data.path=x"], "causal_lm"),
    "hf_mt": (["model=transformer_mt", "data=hf", "data.path=x"], "transformer_mt"),
    "hf_lm": (["model=causal_lm", "data=hf", "data.path=x"], "causal_lm"),
    "cifar": (["model=vit", "data=cifar10", "data.num_workers=0"], "vit"),
    "ljspeech": (["model=tts", "data=ljspeech", "data.path=x", "data.val_size=1", "data.test_size=1"], "tts"),
}
PAIRS = {"hf": {"src_column": "en", "tgt_column": "fr"}}

# (id, data option, the data config's values ({bad}: the folder above), the message's distinctive part)
CASES = [
    *[(f"tsv-{key}-{kind}", "tsv", {"path": "{bad}/good.tsv", key: f"{{bad}}/{file}"}, message)
      for key in ("path", "val_path", "test_path")
      for kind, file, message in (
          ("missing", "nowhere.tsv", "parallel corpus not found: {bad}/nowhere.tsv"),
          ("folder", "a_folder.tsv", "parallel corpus is a folder, not a file: {bad}/a_folder.tsv"),
          ("empty", "empty.tsv", "parallel corpus has no sentence pairs: {bad}/empty.tsv"),
          ("not-utf8", "latin1.tsv", "parallel corpus is not valid UTF-8: {bad}/latin1.tsv:2 (byte 0xe9 at byte "
                                     "offset 22, line 2)"),
          ("no-tab", "no_tab.tsv", "{bad}/no_tab.tsv:2: no tab between source and target: 'no tab here'"))],
    ("tsv-path-null", "tsv", {"path": None}, "source='tsv' needs path="),
    ("tsv-too-few-sources", "tsv", {"path": "{bad}/few.tsv"}, "1 distinct source sentences are too few"),
    ("text-missing", "text", {"path": "{bad}/nowhere.txt"}, "text file not found: {bad}/nowhere.txt"),
    ("text-blank", "text", {"path": "{bad}/blank.txt"}, "text file is empty: {bad}/blank.txt"),
    ("text-not-utf8", "text", {"path": "{bad}/latin1.txt"},
     "text file is not valid UTF-8: {bad}/latin1.txt:4 (byte 0xe9 at byte offset 33, line 4)"),
    ("text-empty-folder", "text", {"path": "{bad}/no_files"}, "no text files in folder {bad}/no_files"),
    ("text-glob-no-match", "text", {"path": "{bad}/*.nothing"}, "no text files match {bad}/*.nothing"),
    ("text-glob-one-bad-file", "text", {"path": "{bad}/texts/*.txt"}, "is not valid UTF-8: {bad}/texts/b.txt:1"),
    ("text-path-null", "text", {"path": None}, "source='text_file' needs path="),
    ("hf-missing-column", "hf_mt", {"path": "{bad}/pairs.jsonl", "hf": {"src_column": "english", "tgt_column": "fr"}},
     "{bad}/pairs.jsonl [train] has no column 'english' for the source (data.hf.src_column); its columns: en, fr"),
    ("hf-broken-jsonl", "hf_mt", {"path": "{bad}/broken.jsonl", **PAIRS}, "datasets could not read {bad}/broken.jsonl"),
    ("hf-missing-file", "hf_mt", {"path": "{bad}/nowhere.jsonl", **PAIRS}, "data.path does not exist"),
    ("hf-unknown-option", "hf_mt", {"path": "{bad}/pairs.jsonl", "hf": {"src_colum": "en"}},
     "unknown data.hf option(s) src_colum"),
    ("hf-lm-missing-column", "hf_lm", {"path": "{bad}/pairs.jsonl", "hf": {"text_column": "body"}},
     "has no column 'body' for the text (data.hf.text_column)"),
    ("cifar-missing", "cifar", {"path": "{bad}/no_cifar"}, "CIFAR-10 folder not found: {bad}/no_cifar"),
    ("cifar-file-not-folder", "cifar", {"path": "{bad}/cifar_is_a_file"}, "CIFAR-10 folder is a file, not a folder"),
    ("cifar-missing-batch", "cifar", {"path": "{bad}/cifar_missing_batch"},
     "CIFAR-10 file missing: {bad}/cifar_missing_batch/data_batch_2"),
    ("cifar-empty-batch", "cifar", {"path": "{bad}/cifar_empty_batch"},
     "malformed CIFAR-10 file {bad}/cifar_empty_batch/data_batch_3: not a readable pickle"),
    ("cifar-garbage-batch", "cifar", {"path": "{bad}/cifar_garbage_batch"},
     "malformed CIFAR-10 file {bad}/cifar_garbage_batch/data_batch_3: not a readable pickle"),
    ("cifar-batch-without-labels", "cifar", {"path": "{bad}/cifar_no_labels"}, "no 'labels' entry"),
    ("ljspeech-missing", "ljspeech", {"path": "{bad}/no_lj"}, "LJSpeech folder not found: {bad}/no_lj"),
    ("ljspeech-no-metadata", "ljspeech", {"path": "{bad}/lj_no_metadata"}, "LJSpeech metadata not found"),
    ("ljspeech-bad-line", "ljspeech", {"path": "{bad}/lj_bad_line"},
     "{bad}/lj_bad_line/metadata.csv:2: expected 'id|text|normalized text'"),
    ("ljspeech-metadata-not-utf8", "ljspeech", {"path": "{bad}/lj_latin1"},
     "{bad}/lj_latin1/metadata.csv is not valid UTF-8 (line 1, byte offset 6)"),
    ("ljspeech-truncated-wav", "ljspeech", {"path": "{bad}/lj_truncated"},
     "{bad}/lj_truncated/wavs/u1.wav: truncated: its header promises 22050 bytes of audio, the file holds 11003"),
    ("ljspeech-missing-wav", "ljspeech", {"path": "{bad}/lj_missing_wav"},
     "audio file not found: {bad}/lj_missing_wav/wavs/u2.wav"),
    ("ljspeech-sample-rate", "ljspeech", {"path": "{bad}/lj_rate"}, "sample rate 16000 Hz; expected 22050 Hz"),
    ("ljspeech-path-null", "ljspeech", {"path": None}, "data.path is not set: give the LJSpeech folder"),
]

GOOD = [
    ("tsv", {"path": "{bad}/good.tsv"}),
    ("tsv", {"path": "{bad}/good.tsv", "val_path": "{bad}/good.tsv", "test_path": "{bad}/good.tsv"}),
    ("text", {"path": "{bad}/good.txt", "seq_len": 8, "batch_size": 2}),
    ("hf_mt", {"path": "{bad}/pairs.jsonl", **PAIRS}),
    ("cifar", {"path": "{bad}/cifar"}),
    ("ljspeech", {"path": "{bad}/lj"}),
    ("ljspeech", {"path": "{bad}/lj_long_text_broken_wav", "max_chars": 200}),
]


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, dict]:
    """Each option's data config as train.py resolves it (a cache and a datasets cache of this module's own)."""
    cache = tmp_path_factory.mktemp("cache")
    out = {}
    for name, (overrides, _) in OPTIONS.items():
        cfg = compose_train(overrides, cache / "out", str(cache))
        out[name] = OmegaConf.to_container(cfg.data, resolve=True)
        if "hf" in out[name]:
            out[name]["hf"]["datasets_cache"] = str(cache / "datasets")
    return out


def _data(base: dict, values: dict, bad: Path) -> dict:
    data = copy.deepcopy(base)
    for key, value in values.items():
        value = value.replace("{bad}", str(bad)) if isinstance(value, str) else value
        if isinstance(value, dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def _refusal(call) -> UserError | None:
    """The one-line refusal ``call`` raises (anywhere in the chain of causes), None if it passes."""
    try:
        call()
    except Exception as e:  # noqa: BLE001
        refused = find_user_error(e)
        assert refused is not None, f"not a one-line refusal: {e!r}"
        return refused
    return None


def _data_module(data: dict):
    """What train.py's run() does with the data: instantiate it, prepare_data, setup('fit')."""
    def run():
        dm = hydra.utils.instantiate(data)
        dm.prepare_data()
        dm.setup("fit")
    return run


@pytest.mark.parametrize("option,values,message", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_the_preflight_refuses_in_the_data_modules_own_words(option, values, message, bad, bases):
    data = _data(bases[option], values, bad)
    model = OPTIONS[option][1]
    early = _refusal(lambda: check_data(data, model))
    late = _refusal(_data_module(data))
    assert early is not None, f"the preflight passed what the data module refuses: {late}"
    assert late is not None, f"the preflight refused what the data module reads: {early}"
    assert (type(early), str(early)) == (type(late), str(late))
    assert message.replace("{bad}", str(bad)) in str(early)
    assert "\n" not in str(early)


@pytest.mark.parametrize("option,values", [pytest.param(*g, id=f"{g[0]}-{i}") for i, g in enumerate(GOOD)])
def test_good_files_pass_both(option, values, bad, bases):
    data = _data(bases[option], values, bad)
    assert _refusal(lambda: check_data(data, OPTIONS[option][1])) is None
    assert _refusal(_data_module(data)) is None


def test_a_tokenized_corpus_is_not_read_again_until_it_changes(bad, bases, tmp_path, monkeypatch):
    """The LM's text is read by the preflight only when the data module will read it: not once its tokenizer and
    token shards are cached for the file's path, size and mtime (a 1 GB corpus is not decoded on every run)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((bad / "good.txt").read_text(), encoding="utf-8")
    data = _data(bases["text"], {"path": str(corpus), "cache_dir": str(tmp_path / "cache"), "seq_len": 8,
                                 "batch_size": 2}, bad)
    reads = []
    real = preflight.read_text
    monkeypatch.setattr(preflight, "read_text", lambda *a, **k: reads.append(1) or real(*a, **k))
    check_data(data, "causal_lm")
    assert reads == [1]  # nothing cached yet: read
    _data_module(data)()
    check_data(data, "causal_lm")
    assert reads == [1]  # tokenized: not read
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 10**9))
    check_data(data, "causal_lm")
    assert reads == [1, 1]  # changed since: read again


def test_cifar_to_download_is_not_read(bad, bases):
    """data.download=true: prepare_data fetches the batches first, so a folder not there yet is no refusal."""
    data = _data(bases["cifar"], {"path": "{bad}/not_downloaded_yet", "download": True}, bad)
    check_data(data, "vit")
    assert not (bad / "not_downloaded_yet").exists()


def test_the_preflight_imports_neither_torch_nor_lightning(bad, bases):
    """Every reader the preflight runs is torch-free (``datasets`` for data=hf only): what makes a refusal cheap."""
    configs = [(_data(bases[option], values, bad), OPTIONS[option][1]) for option, values in GOOD]
    code = ("import json, sys\n"
            "from attnlab.runs.data_check import check_data\n"
            "for data, model in json.loads(sys.stdin.read()):\n"
            "    check_data(data, model)\n"
            "print(' '.join(m for m in ('torch', 'lightning') if m in sys.modules) or 'neither')\n")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(configs), text=True, capture_output=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["neither"], out.stdout


def test_every_data_option_is_checked_or_generated():
    """A data module renamed or added without a place here would pass its files unread: every conf/data option's
    _target_ is a reader the preflight knows, data=hf, or a generated data set; every reader names a class."""
    targets = {p.stem: OmegaConf.load(p).get("_target_") for p in sorted((CONF_DIR / "data").glob("*.yaml"))}
    targets["text_file"] = targets["text_file"] or targets["pydoc"]  # (its defaults: pydoc's)
    unknown = {name: t for name, t in targets.items() if t not in {*CHECKS, *GENERATED, HF_TARGET}}
    assert not unknown, unknown
    for target in (*CHECKS, *GENERATED):
        assert isinstance(hydra.utils.get_class(target), type), target
