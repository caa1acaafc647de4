"""Causal language-model data: text -> byte-level BPE ids -> fixed-length windows.

Pipeline (everything cached under ``cache_dir``, keyed by content hashes):

    text (pydoc or a user file) --normalize (data.normalize)--train_or_load_bpe--> tokenizer (stores the normalizer)
    tokenizer.encode(text) --> <cache_dir>/tokens/<key>.npy   (uint16 / int32, 1-D)
    split contiguously: [ train | val | test ]

Train items are windows at pseudo-random offsets, val/test items consecutive windows.
Every item is ``{"input_ids": LongTensor[T], "labels": LongTensor[T]}`` with
``labels[t] == input_ids[t + 1]`` (both cut from one (T+1)-long slice).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from attnlab.data.corpus import pydoc_text, read_text_file
from attnlab.data.errors import ConfigError, DataError
from attnlab.data.loading import EpochDataLoader, FrozenEpochSampler, MidEpochResume, mix64, sequential_sampler
from attnlab.data.normalization import TextNormalization
from attnlab.data.tokenizer import BPETokenizer, train_or_load_bpe

SOURCES = ("pydoc", "text_file")
TOKENS_FORMAT_VERSION = "tokens-v1"
# The LM learns text as written: case and punctuation are content. Only the Unicode form is unified (NFC), so that
# composed and decomposed accents are the same tokens; generate's prompts get the same, through the tokenizer.
DEFAULT_NORMALIZATION = {"unicode": "NFC", "remove": "", "whitespace": False, "case": "keep"}


# --------------------------------------------------------------------------------------
# Corpus -> cached token array
# --------------------------------------------------------------------------------------
def load_text(source: str, path: str | os.PathLike | None = None) -> str:
    """The raw text of a data source (see ``SOURCES``)."""
    if source == "pydoc":
        return pydoc_text()
    if source == "text_file":
        if path is None:
            raise ConfigError("source='text_file' needs path=<a UTF-8 text file>")
        return read_text_file(path)
    raise ConfigError(f"unknown data source {source!r}; valid sources: {', '.join(SOURCES)}")


def _atomic_save_npy(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def tokenize_corpus(
    text: str, vocab_size: int, cache_dir: str | os.PathLike, normalization: TextNormalization | None = None
) -> tuple[BPETokenizer, np.ndarray]:
    """Tokenizer and the whole text's ids, trained/encoded once and then read from the cache.

    The tokenizer is trained on the normalized text and stores the normalizer (``encode`` applies it).

    The token file key hashes the tokenizer JSON and the text, so a changed corpus or
    tokenizer never reuses stale ids. Cheap when cached (hashing + one ``np.load``), so
    ``prepare_data`` and ``setup`` can both call it. Returns a read-only memory map of
    shape [n_tokens] (uint16 when the vocab fits, else int32).
    """
    normalizer = (normalization or TextNormalization()).normalizer([text])
    tok = train_or_load_bpe(normalizer.normalize_str(text), vocab_size, cache_dir, normalizer)
    h = hashlib.sha256(f"{TOKENS_FORMAT_VERSION}\n".encode())
    h.update(tok.to_str().encode("utf-8"))
    h.update(text.encode("utf-8"))
    path = Path(cache_dir) / "tokens" / f"{h.hexdigest()[:16]}.npy"
    if not path.is_file():
        dtype = np.uint16 if tok.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
        _atomic_save_npy(path, np.asarray(tok.encode(text), dtype=dtype))
    return tok, np.load(path, mmap_mode="r")


# --------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------
def _window(tokens: np.ndarray, start: int, seq_len: int) -> dict[str, torch.Tensor]:
    chunk = torch.from_numpy(np.asarray(tokens[start : start + seq_len + 1], dtype=np.int64))
    return {"input_ids": chunk[:-1], "labels": chunk[1:]}  # [T], [T]


class RandomWindowDataset(Dataset):
    """``num_windows`` windows of ``seq_len + 1`` tokens at pseudo-random offsets.

    Item ``i`` of epoch ``e`` starts at an offset drawn from a ``torch.Generator`` seeded
    by a hash of ``(seed, e, i)``: deterministic, independent of which worker or DDP
    rank reads it, and needs no RNG state shared between workers. The epoch is kept in
    a shared-memory tensor so that ``set_epoch`` in the main process also reaches
    persistent DataLoader workers.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, num_windows: int, seed: int = 0):
        if len(tokens) < seq_len + 1:
            raise ValueError(f"need at least seq_len+1={seq_len + 1} tokens, got {len(tokens)}")
        self.tokens = tokens  # [N]
        self.seq_len = seq_len
        self.num_windows = num_windows
        self.seed = seed
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    def offset(self, i: int) -> int:
        g = torch.Generator().manual_seed(mix64(self.seed, self.epoch, i))
        high = len(self.tokens) - self.seq_len  # exclusive: last start keeps T+1 tokens
        return int(torch.randint(high, (1,), generator=g))

    def __len__(self) -> int:
        return self.num_windows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < self.num_windows:
            raise IndexError(i)
        return _window(self.tokens, self.offset(i), self.seq_len)


class ConsecutiveWindowDataset(Dataset):
    """Non-overlapping consecutive windows (inputs do not overlap; window j's last label
    is window j+1's first input), for a deterministic evaluation of the whole split."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens = tokens  # [N]
        self.seq_len = seq_len

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return _window(self.tokens, i * self.seq_len, self.seq_len)


# --------------------------------------------------------------------------------------
# DataModule
# --------------------------------------------------------------------------------------
class LMDataModule(MidEpochResume, L.LightningDataModule):
    """Causal-LM data from CPython's pydoc text (offline default) or a UTF-8 text file.

    The tokenizer is trained with ``vocab_size`` entries at most; the model should use
    the requested ``vocab_size`` (rows beyond ``self.vocab_size`` simply stay unused), so
    the model can be built before the data is prepared.

    Usable without a Trainer: ``dm.prepare_data(); dm.setup("fit")``.
    """

    def __init__(
        self,
        source: str = "pydoc",
        path: str | None = None,
        vocab_size: int = 4096,
        seq_len: int = 128,
        batch_size: int = 32,
        num_workers: int = 0,
        cache_dir: str = ".cache",
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        train_windows_per_epoch: int | None = None,
        seed: int = 0,
        pin_memory: bool = False,
        normalize: dict | None = None,
    ):
        super().__init__()
        if source not in SOURCES:
            raise ConfigError(f"unknown data source {source!r}; valid sources: {', '.join(SOURCES)}")
        if source == "text_file" and not path:
            raise ConfigError("source='text_file' needs path=<a UTF-8 text file>")
        if seq_len < 1 or batch_size < 1:
            raise ConfigError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
        fractions_ok = 0 <= val_fraction < 1 and 0 <= test_fraction < 1
        if not (fractions_ok and val_fraction + test_fraction < 1):
            raise ConfigError(
                f"val_fraction={val_fraction} and test_fraction={test_fraction} must be in [0, 1) "
                "and sum to < 1"
            )
        self.normalization = TextNormalization.from_config(DEFAULT_NORMALIZATION if normalize is None else normalize)
        self.save_hyperparameters()
        self.hparams.normalize = self.normalization.as_dict()
        self.tokenizer: BPETokenizer | None = None
        self.vocab_size: int | None = None  # real tokenizer size, known after setup()
        self.train_dataset: RandomWindowDataset | None = None
        self.val_dataset: ConsecutiveWindowDataset | None = None
        self.test_dataset: ConsecutiveWindowDataset | None = None

    def _tokenize(self) -> tuple[BPETokenizer, np.ndarray]:
        hp = self.hparams
        text = load_text(hp.source, hp.path)
        return tokenize_corpus(text, hp.vocab_size, hp.cache_dir, self.normalization)

    def prepare_data(self) -> None:
        """Train the tokenizer and encode the corpus into the cache (rank 0 under DDP)."""
        self._tokenize()

    def setup(self, stage: str | None = None) -> None:
        """Load tokenizer and ids (cheap once cached) and split them [train | val | test]."""
        if self.tokenizer is not None:
            return
        hp = self.hparams
        tokenizer, tokens = self._tokenize()
        n = len(tokens)
        n_val, n_test = int(n * hp.val_fraction), int(n * hp.test_fraction)
        n_train = n - n_val - n_test
        splits = {
            "train": tokens[:n_train],
            "val": tokens[n_train : n_train + n_val],
            "test": tokens[n_train + n_val :],
        }
        fractions = {"val": hp.val_fraction, "test": hp.test_fraction}
        for name, part in splits.items():
            if fractions.get(name, 1.0) > 0 and len(part) < hp.seq_len + 1:
                raise DataError(
                    f"{name} split has {len(part)} tokens, fewer than seq_len+1={hp.seq_len + 1} "
                    f"(corpus: {n} tokens); use more text, a shorter seq_len or a larger fraction"
                )
        num_windows = hp.train_windows_per_epoch or len(splits["train"]) // hp.seq_len
        if num_windows < hp.batch_size:
            raise DataError(
                f"{num_windows} train windows per epoch < batch_size={hp.batch_size}: "
                "drop_last would leave no batch"
            )
        self.train_dataset = RandomWindowDataset(splits["train"], hp.seq_len, num_windows, hp.seed)
        self.val_dataset = ConsecutiveWindowDataset(splits["val"], hp.seq_len)
        self.test_dataset = ConsecutiveWindowDataset(splits["test"], hp.seq_len)
        self.tokenizer, self.vocab_size = tokenizer, tokenizer.vocab_size

    # -- loaders ---------------------------------------------------------------------
    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        hp = self.hparams
        return EpochDataLoader(
            dataset,
            batch_size=hp.batch_size,
            shuffle=False,
            sampler=sequential_sampler(dataset, drop_last=True) if train else None,
            drop_last=train,
            num_workers=hp.num_workers,
            pin_memory=hp.pin_memory,
            persistent_workers=hp.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        loader = self._loader(self._require(self.train_dataset), train=True)
        if self.trainer is not None and self.trainer.overfit_batches:
            # debug=overfit must see the same windows every epoch: freeze the offsets at epoch 0
            loader = EpochDataLoader(loader.dataset, batch_size=loader.batch_size, sampler=FrozenEpochSampler(
                loader.dataset), drop_last=True, num_workers=loader.num_workers)
        return self._resumable(loader)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self._require(self.val_dataset), train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self._require(self.test_dataset), train=False)

    def _require(self, dataset: Dataset | None) -> Dataset:
        if dataset is None:
            raise RuntimeError("LMDataModule: call prepare_data() and setup() first")
        return dataset

    # -- helpers for callbacks / generation --------------------------------------------
    def example_text(self, n_tokens: int = 64) -> torch.Tensor:
        """A fixed snippet: the first ``n_tokens`` ids of the validation split, LongTensor[1, n]."""
        tokens = self._require(self.val_dataset).tokens
        if not 0 < n_tokens <= len(tokens):
            raise ValueError(f"n_tokens must be in [1, {len(tokens)}], got {n_tokens}")
        return torch.from_numpy(np.asarray(tokens[:n_tokens], dtype=np.int64)).unsqueeze(0)

    def decode(self, ids, skip_special: bool = True) -> str:
        """Text of a 1-D id sequence (list, tensor or array)."""
        if self.tokenizer is None:
            raise RuntimeError("LMDataModule: call setup() first")
        return self.tokenizer.decode(ids, skip_special=skip_special)
