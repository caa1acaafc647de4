"""train.py's read of the data files before it imports Lightning: a bad file is refused in the same one line as the
data module's, without the seconds of importing Lightning, and the refused run leaves no folder. Nothing here imports
torch or Lightning (``datasets`` only for data=hf): what train.py checks before this decides whether torch is loaded
by then (its model-size check builds the net on torch's meta device).

:func:`check_data` reads every file the data module of a ``data`` config will read, through the functions that
data module reads them with (data/user_pairs.py and parallel.py for pairs, hf_source.py, lm_corpus.py and
text_sources.py for the LM's text, cifar10_files.py, ljspeech.py and audio/wav.py), so a refusal here is the data
module's own message and no rule about a file is written twice. Generated data (numbers, pydoc, digits, espeak,
needle_recall) have no file to read. What the data module decides only from what it builds (TSV pairs longer than
seq_len tokens, the LM's splits counted in tokens, utterances longer than max_frames) stays its own check, after
Lightning.

What it costs, on top of what the data module reads anyway:

* pairs (data=tsv, data=hf for translation): one more parse; the data module parses them in prepare_data and again
  in setup (it keeps no parse, only the tokenizer, in its cache).
* the LM's text (data=text_file, data=hf): nothing when its tokenizer and token shards are cached (the cache is keyed
  by each file's path, size and mtime, and the data module then reads no text either), so a tokenized 1 GB corpus
  costs a few ``stat`` calls on every run; else one more read, UTF-8 decoded in the chunks the shards read (about
  a second per GB, before the minutes of tokenizing it). data=hf's text column is exported into the cache here, once;
  the data module finds it there.
* CIFAR-10: its six batch files (~180 MB) once more, unless data.download=true (prepare_data fetches them first).
* LJSpeech: the metadata, and each WAV the data module will read, once more (the data module computes its mel too).

An option a hand-made data config leaves out (the data module's default then applies) skips the checks that need
it: the data module still makes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..audio.mel_config import MelConfig
from ..data.characters import CharVocab
from ..data.cifar10_files import load_cifar10
from ..data.hf_source import HF_DATA_MODULES, hf_options
from ..data.ljspeech import corpus_folder, load_audio, utterances
from ..data.lm_corpus import (
    DEFAULT_TOKENIZER_SAMPLE_MB,
    lm_normalization,
    read_text,
    text_sources,
    tokenized,
    tokenizer_sample_bytes,
)
from ..data.parallel import DEFAULT_BUCKET_EDGES, check_bucket_edges
from ..data.user_pairs import read_user_pairs, user_splits

HF_TARGET = "attnlab.families.hf_datamodule"  # data=hf: the data module of the model's family reads the dataset


class _Unset(Exception):
    """An option the data config does not give: the checks that need it are left to the data module."""


def _option(options: Mapping[str, Any], key: str) -> Any:
    if key not in options:
        raise _Unset(key)
    return options[key]


def check_data(data: Mapping[str, Any], model_name: str | None = None) -> None:
    """Read the files the data module of ``data`` (the resolved ``data`` config: plain containers) will read; a bad
    one raises the UserError, with the message, that data module raises for it. ``model_name``: ``model.name``,
    which picks the data module of ``data=hf`` (its ``data.model`` says the same)."""
    options = dict(data)
    target = options.pop("_target_", None)
    if target == HF_TARGET:
        target = _hf_reader(options.pop("model", None) or model_name)
        options["source"] = "hf"
    check = CHECKS.get(target)
    if check is None:
        return
    try:
        check(options)
    except _Unset:
        pass


def _hf_reader(model: str | None) -> str | None:
    """The data module that reads a Hugging Face dataset for ``model``; None for a model data=hf does not serve (the
    data module refuses it in its own line: attnlab.families.hf_datamodule)."""
    from ..families import get

    try:
        kind = get(str(model)).data
    except KeyError:
        return None
    return HF_DATA_MODULES.get(kind)


def _pairs(options: Mapping[str, Any]) -> None:
    """TranslationDataModule with source tsv or hf (numbers are generated)."""
    source = _option(options, "source")
    if source not in ("tsv", "hf"):
        return
    path = options.get("path")
    hf = hf_options(source, path, options.get("hf"))
    edges = check_bucket_edges(options.get("bucket_edges", DEFAULT_BUCKET_EDGES))  # (they only name the buckets)
    given = read_user_pairs(source, path, options.get("val_path"), options.get("test_path"), hf, edges)
    user_splits(given, path, _option(options, "val_fraction"), _option(options, "test_fraction"),
                _option(options, "seed"))


def _lm_text(options: Mapping[str, Any]) -> None:
    """LMDataModule with source text_file or hf (pydoc ships with Python)."""
    source = _option(options, "source")
    if source not in ("text_file", "hf"):
        return
    path, cache_dir = options.get("path"), _option(options, "cache_dir")
    sources = text_sources(source, path, hf_options(source, path, options.get("hf")), cache_dir)
    normalization = lm_normalization(options.get("normalize"))
    budget = tokenizer_sample_bytes(options.get("tokenizer_sample_mb", DEFAULT_TOKENIZER_SAMPLE_MB))
    if not tokenized(sources, _option(options, "vocab_size"), cache_dir, normalization, budget):
        read_text(sources, avoid=normalization.remove)


def _cifar10(options: Mapping[str, Any]) -> None:
    if options.get("download"):
        return  # prepare_data downloads the batches first (a complete folder is kept): nothing to read yet
    load_cifar10(_option(options, "path"))


def _ljspeech(options: Mapping[str, Any]) -> None:
    kept, _ = utterances(corpus_folder(options.get("path")), CharVocab(), _option(options, "max_chars"),
                         options.get("limit"))
    rate = MelConfig.from_cfg(options.get("mel")).sample_rate
    for entry, _ in kept:
        load_audio(entry, rate)


# the data modules that read files, by ``_target_``; tests/data/test_preflight.py checks that each names a class and
# that every option of conf/data is here, is data=hf or is in GENERATED
CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    "attnlab.data.translation_datamodule.TranslationDataModule": _pairs,
    "attnlab.data.lm_datamodule.LMDataModule": _lm_text,
    "attnlab.data.cifar10.CIFAR10DataModule": _cifar10,
    "attnlab.data.speech_datamodule.SpeechDataModule": _ljspeech,
}
GENERATED = ("attnlab.data.digits.DigitsDataModule", "attnlab.data.speech_datamodule.EspeakDataModule",
             "attnlab.data.needle_recall.NeedleRecallDataModule")
