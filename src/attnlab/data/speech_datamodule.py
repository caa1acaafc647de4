"""Text-to-speech data: (characters, normalized log-mel frames) pairs from an LJSpeech-format folder.

``data=ljspeech data.path=…`` reads any such folder (LJSpeech itself); ``data=espeak`` first synthesizes one with
eSpeak NG under the cache (:mod:`attnlab.data.espeak_corpus`). Every utterance's mel is computed once at setup and
kept in memory (the default corpus is ~2,000 short utterances, ~30 MB of frames).

Batch (padded to the longest item):

    text          (B, N) long, CharVocab ids, 0 = padding
    text_lengths  (B,)   long
    mel           (B, T, n_mels) float, 0 beyond the length
    mel_lengths   (B,)   long

Splits: ``val_size`` and ``test_size`` utterances drawn with ``seed``, the rest trains. Training batches group
utterances of similar length (shuffled pools of ``bucket_pool`` batches, sorted inside), so little is padding.
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from ..audio.features import MelConfig, MelExtractor
from .characters import CharVocab
from ..core.errors import CorpusError
from .ljspeech import corpus_folder, load_audio, utterances
from .loading import BatchDataset, MidEpochResume, batch_loader

log = logging.getLogger(__name__)


class SpeechDataset(Dataset):
    def __init__(self, texts: list[Tensor], mels: list[Tensor], ids: list[str], raw: list[str]):
        self.texts, self.mels, self.ids, self.raw = texts, mels, ids, raw

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> dict:
        return {"text": self.texts[i], "mel": self.mels[i], "index": i}

    def lengths(self) -> list[int]:
        return [m.shape[0] for m in self.mels]


def collate_speech(items: list[dict]) -> dict[str, Tensor]:
    b = len(items)
    n = max(len(it["text"]) for it in items)
    t = max(it["mel"].shape[0] for it in items)
    text = torch.zeros(b, n, dtype=torch.long)
    mel = torch.zeros(b, t, items[0]["mel"].shape[1])
    for i, it in enumerate(items):
        text[i, : len(it["text"])] = it["text"]
        mel[i, : it["mel"].shape[0]] = it["mel"]
    return {"text": text, "text_lengths": torch.tensor([len(it["text"]) for it in items]),
            "mel": mel, "mel_lengths": torch.tensor([it["mel"].shape[0] for it in items]),
            "index": torch.tensor([it["index"] for it in items])}


class SpeechDataModule(MidEpochResume, L.LightningDataModule):
    """Args:
        path: the LJSpeech-format folder.
        mel: :class:`~attnlab.audio.features.MelConfig` fields (sample rate, STFT, mel bins, normalization).
        max_chars / max_frames: utterances longer than this are left out (logged), to bound memory and time.
        limit: use only the first N utterances of the metadata (None: all); for quick looks at a large corpus.
    """

    def __init__(self, path: str | None = None, mel: dict | None = None, batch_size: int = 32,
                 val_size: int = 64, test_size: int = 64, max_chars: int = 200, max_frames: int = 1000,
                 limit: int | None = None, bucket_pool: int = 50, num_workers: int = 0, seed: int = 0):
        super().__init__()
        self.path = path
        self.mel_cfg = MelConfig.from_cfg(mel)
        self.batch_size, self.val_size, self.test_size = batch_size, val_size, test_size
        self.max_chars, self.max_frames, self.limit = max_chars, max_frames, limit
        self.bucket_pool, self.num_workers, self.seed = bucket_pool, num_workers, seed
        self.vocab = CharVocab()
        self.splits: dict[str, SpeechDataset] = {}

    def corpus_folder(self) -> Path:
        return corpus_folder(self.path)

    def load(self) -> tuple[list[Tensor], list[Tensor], list[str], list[str]]:
        kept, dropped = utterances(self.corpus_folder(), self.vocab, self.max_chars, self.limit)
        extract = MelExtractor(self.mel_cfg)
        texts, mels, ids, raw = [], [], [], []
        for e, ids_ in kept:
            mel = extract(torch.from_numpy(load_audio(e, self.mel_cfg.sample_rate)))
            if mel.shape[0] > self.max_frames:
                dropped += 1
                continue
            texts.append(torch.tensor(ids_))
            mels.append(mel)
            ids.append(e.id)
            raw.append(e.text)
        if dropped:
            log.info(f"left out {dropped} utterances longer than {self.max_chars} characters or "
                     f"{self.max_frames} frames")
        if len(texts) < self.val_size + self.test_size + 1:
            raise CorpusError(f"{self.corpus_folder()}: {len(texts)} usable utterances, fewer than "
                              f"val_size + test_size + 1 = {self.val_size + self.test_size + 1}")
        return texts, mels, ids, raw

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        texts, mels, ids, raw = self.load()
        order = np.random.default_rng(self.seed).permutation(len(texts))
        cut = {"val": order[: self.val_size], "test": order[self.val_size : self.val_size + self.test_size],
               "train": order[self.val_size + self.test_size :]}
        for name, idx in cut.items():
            idx = sorted(int(i) for i in idx)
            self.splits[name] = SpeechDataset([texts[i] for i in idx], [mels[i] for i in idx],
                                              [ids[i] for i in idx], [raw[i] for i in idx])

    def _loader(self, name: str, train: bool) -> DataLoader:
        """Batches of similar lengths. Training: shuffled pools of ``bucket_pool`` batches, sorted inside, in a new
        order every epoch (a function of ``(seed, epoch)``: the same under DDP, where ranks take whole batches,
        and after a mid-epoch resume). Evaluation: the whole split sorted by length, deterministic."""
        ds = self.splits[name]
        overfit = train and self.trainer is not None and bool(self.trainer.overfit_batches)
        batches = BatchDataset(ds, self.batch_size, shuffle=train, collate=collate_speech, pool=self.bucket_pool,
                               seed=self.seed, sort_keys=(np.asarray(ds.lengths()),), frozen=overfit)
        return batch_loader(batches, train, self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._resumable(self._loader("train", train=True))

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)

    def example(self, split: str = "val", index: int | None = None) -> dict[str, Tensor]:
        """One utterance as a batch of one (the attention-map and audio sample); None: the median-length one."""
        ds = self.splits[split]
        lengths = ds.lengths()
        i = sorted(range(len(ds)), key=lambda k: lengths[k])[len(ds) // 2] if index is None else index
        return collate_speech([ds[i]])


class EspeakDataModule(SpeechDataModule):
    """``data=espeak``: the corpus is synthesized with eSpeak NG on first use (see espeak_corpus)."""

    def __init__(self, num_utterances: int = 2000, max_digits: int = 4, pydoc_fraction: float = 0.0,
                 sentence_max_chars: int = 60, voice: str = "en-us", rate: int = 175, cache_dir: str = ".cache",
                 **kwargs):
        super().__init__(path=None, **kwargs)
        self.generation = dict(num_utterances=num_utterances, seed=self.seed, max_digits=max_digits,
                               pydoc_fraction=pydoc_fraction, max_chars=sentence_max_chars, voice=voice, rate=rate)
        self.cache_dir = cache_dir

    def prepare_data(self) -> None:
        self.corpus_folder()

    def corpus_folder(self) -> Path:
        from .espeak_corpus import ensure_espeak_corpus

        if self.path is None:
            self.path = str(ensure_espeak_corpus(self.cache_dir, log=log.info, **self.generation))
        return Path(self.path)
