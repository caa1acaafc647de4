"""The speech corpus for real: eSpeak NG synthesizes, the corpus is written as an LJSpeech folder, the LJSpeech
reader reads it back (and refuses broken folders with one line naming the file), and the data module batches it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from attnlab.audio.espeak import ESpeak
from attnlab.data.characters import CharVocab
from attnlab.data.espeak_corpus import corpus_sentences, ensure_espeak_corpus, pydoc_sentences
from attnlab.data.ljspeech import read_metadata
from attnlab.data.speech_datamodule import EspeakDataModule, SpeechDataModule
from attnlab.core.errors import ConfigError, CorpusError

N_UTT = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("speech_cache")
    return ensure_espeak_corpus(cache, N_UTT, seed=3, max_digits=3, pydoc_fraction=0.25, max_chars=40)


def test_espeak_speaks_non_silent_audio_at_22050_hz():
    engine = ESpeak.get()
    assert engine.sample_rate == 22050
    a = engine.synthesize("twenty one")
    b = engine.synthesize("nine thousand nine hundred and ninety-nine")
    assert a.dtype == np.int16 and 0.3 < len(a) / 22050 < 2.0
    assert np.abs(a).max() > 3000 and np.sqrt(np.mean(a.astype(float) ** 2)) > 300  # speech, not silence
    assert len(b) > 2 * len(a)  # longer text, longer audio
    # eSpeak is not bitwise repeatable (a few samples of jitter per call), but the same text gives the same speech
    again = engine.synthesize("twenty one")
    assert abs(len(again) - len(a)) < 0.02 * len(a)


def test_sentences_are_deterministic_and_mix_sources():
    a = corpus_sentences(40, seed=1, max_digits=2, pydoc_fraction=0.25, max_chars=50)
    assert a == corpus_sentences(40, seed=1, max_digits=2, pydoc_fraction=0.25, max_chars=50)
    assert a != corpus_sentences(40, seed=2, max_digits=2, pydoc_fraction=0.25, max_chars=50)
    pydoc = set(pydoc_sentences(50))
    assert sum(s in pydoc for s in a) == 10
    assert all(CharVocab().covers(s) and len(s) <= 50 for s in a)


def test_corpus_is_an_ljspeech_folder_the_reader_round_trips(corpus):
    lines = (corpus / "metadata.csv").read_text().splitlines()
    assert len(lines) == N_UTT and all(len(line.split("|")) == 3 for line in lines)
    entries = read_metadata(corpus)
    expected = corpus_sentences(N_UTT, seed=3, max_digits=3, pydoc_fraction=0.25, max_chars=40)
    assert [e.text for e in entries] == expected
    for e in entries:
        data, rate = sf.read(str(e.wav))
        assert rate == 22050 and data.ndim == 1 and np.abs(data).max() > 0.05
    # a second call reuses the folder (nothing re-synthesized)
    stamp = (corpus / "metadata.csv").stat().st_mtime_ns
    again = ensure_espeak_corpus(corpus.parents[1], N_UTT, seed=3, max_digits=3, pydoc_fraction=0.25, max_chars=40)
    assert again == corpus and (corpus / "metadata.csv").stat().st_mtime_ns == stamp


def test_ljspeech_datamodule_batches(corpus):
    dm = SpeechDataModule(path=str(corpus), batch_size=4, val_size=2, test_size=2, seed=0)
    dm.setup()
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [12, 2, 2]
    batch = next(iter(dm.train_dataloader()))
    b, n = batch["text"].shape
    assert b == 4 and batch["mel"].shape[0] == 4 and batch["mel"].shape[2] == 80
    assert batch["text_lengths"].max() == n and batch["mel_lengths"].max() == batch["mel"].shape[1]
    for i in range(b):  # padding is zero, real frames are not silence-only
        tl, ml = int(batch["text_lengths"][i]), int(batch["mel_lengths"][i])
        assert (batch["text"][i, tl:] == 0).all() and (batch["text"][i, :tl] > 0).all()
        assert (batch["mel"][i, ml:] == 0).all() and batch["mel"][i, :ml].std() > 0.3
    # frames = samples // hop + 1 for every utterance
    e = read_metadata(corpus)[0]
    samples = sf.info(str(e.wav)).frames
    k = dm.splits["train"].ids.index(e.id) if e.id in dm.splits["train"].ids else None
    if k is not None:
        assert dm.splits["train"].mels[k].shape[0] == samples // 256 + 1
    # normalized log-mels are roughly zero-mean, unit-scale
    all_frames = torch.cat(dm.splits["train"].mels)
    assert -1.5 < float(all_frames.mean()) < 1.5 and 0.5 < float(all_frames.std()) < 1.5


def test_espeak_datamodule_generates_into_the_cache(tmp_path):
    dm = EspeakDataModule(num_utterances=6, max_digits=1, cache_dir=str(tmp_path), val_size=1, test_size=1,
                          batch_size=2)
    dm.prepare_data()
    dm.setup()
    (folder,) = (tmp_path / "espeak").iterdir()
    assert Path(dm.path) == folder and len(dm.splits["train"]) == 4


@pytest.fixture
def broken(corpus, tmp_path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(corpus, copy)
    return copy


def _one_line(exc: pytest.ExceptionInfo, *parts: str) -> None:
    msg = str(exc.value)
    assert "\n" not in msg and all(p in msg for p in parts), msg


def test_reader_refuses_wrong_rate_stereo_missing_and_malformed(broken):
    entries = read_metadata(broken)
    dm = lambda: SpeechDataModule(path=str(broken), val_size=1, test_size=1)  # noqa: E731

    data, _ = sf.read(str(entries[2].wav))
    sf.write(str(entries[2].wav), data, 16000)
    with pytest.raises(CorpusError) as e:
        dm().setup()
    _one_line(e, entries[2].wav.name, "sample rate 16000 Hz")

    sf.write(str(entries[2].wav), np.stack([data, data], 1), 22050)
    with pytest.raises(CorpusError) as e:
        dm().setup()
    _one_line(e, entries[2].wav.name, "2 channels")

    entries[2].wav.unlink()
    with pytest.raises(CorpusError) as e:
        dm().setup()
    _one_line(e, entries[2].wav.name, "not found")

    meta = broken / "metadata.csv"
    meta.write_text(meta.read_text() + "just some text without an id column\n")
    with pytest.raises(CorpusError) as e:
        read_metadata(broken)
    _one_line(e, f"metadata.csv:{N_UTT + 1}", "expected 'id|text|normalized text'")

    with pytest.raises(CorpusError) as e:
        SpeechDataModule(path=str(broken / "nope")).setup()
    _one_line(e, "LJSpeech folder not found", "nope")

    assert isinstance(e.value, ConfigError)  # train.py: this one line and exit status 2, no traceback


def test_reader_refuses_a_truncated_wav_and_non_utf8_metadata(broken):
    from attnlab.core.errors import UserError

    entries = read_metadata(broken)
    wav = entries[3].wav
    size = wav.stat().st_size
    wav.write_bytes(wav.read_bytes()[: size // 2])  # an interrupted copy: libsndfile would read the half silently
    with pytest.raises(CorpusError) as e:
        SpeechDataModule(path=str(broken), val_size=1, test_size=1).setup()
    _one_line(e, str(wav), f"header promises {size - 44} bytes of audio", f"the file holds {size // 2 - 44}")
    assert isinstance(e.value, UserError)  # train.py: one line, exit 2 (tests/test_bad_inputs.py)

    meta = broken / "metadata.csv"
    meta.write_bytes(meta.read_bytes() + b"x|caf\xe9|caf\xe9\n")
    with pytest.raises(CorpusError) as e:
        read_metadata(broken)
    _one_line(e, "metadata.csv is not valid UTF-8", f"line {N_UTT + 1}")
