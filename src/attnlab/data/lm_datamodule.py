"""Causal language-model data: text -> byte-level BPE ids -> fixed-length windows, at any corpus size.

Pipeline (everything cached under ``cache_dir``, keyed by the sources' fingerprints, the settings and the tokenizer):

    sources: pydoc, or data.path = a text file, a folder or a glob   (lm_corpus.py, text_sources.py)
    --normalize (data.normalize)--train on <= tokenizer_sample_mb of text, read in chunks-->
        <cache_dir>/tokenizers/bpe-<vocab>-<key>.json  (stores the normalizer)
    --chunks of 1 MiB, parallel encode_batch--> <cache_dir>/tokens/<key>/shard-*.bin + manifest.json  (shards.py)
    one TokenStream over the shards, split contiguously: [ train | val | test ]

Nothing holds the corpus in memory: tokenization streams it, training reads windows from the memory-mapped shards.
Train items are windows at pseudo-random offsets, val/test items consecutive windows.
Every item is ``{"input_ids": LongTensor[T], "labels": LongTensor[T]}`` with
``labels[t] == input_ids[t + 1]`` (both cut from one (T+1)-long slice).
"""

from __future__ import annotations

import os

import lightning as L
import numpy as np
import torch
from tokenizers import Tokenizer, models
from torch.utils.data import DataLoader, Dataset

from attnlab.data import tokenizer as tokmod
from ..core.errors import ConfigError, DataError
from attnlab.data.loading import EpochDataLoader, FrozenEpochSampler, MidEpochResume, mix64, sequential_sampler
from attnlab.data.normalization import TextNormalization
from attnlab.data.shards import CHUNK_BYTES, ChunkEncoder, TokenStream, build_shards, complete_manifest, shards_dir
from attnlab.data.hf_source import hf_options
from attnlab.data.lm_corpus import (DEFAULT_TOKENIZER_SAMPLE_MB, SOURCES, lm_normalization,
                                    text_sources, tokenizer_cache, tokenizer_sample_bytes)
from attnlab.data.text_sources import BlankCheck, TextSource, sample_chunks
from attnlab.data.tokenizer import BPETokenizer


# --------------------------------------------------------------------------------------
# Corpus -> tokenizer -> token shards
# --------------------------------------------------------------------------------------
def corpus_tokenizer(sources: list[TextSource], vocab_size: int, cache_dir: str | os.PathLike,
                     normalization: TextNormalization | None = None,
                     sample_bytes: int = DEFAULT_TOKENIZER_SAMPLE_MB << 20) -> BPETokenizer:
    """The BPE for these sources, trained once (on the normalized text of ``sample_chunks``: the whole corpus up to
    ``sample_bytes``, else that much spread over it), then read from the cache (a few ``stat`` calls: see
    :func:`~attnlab.data.lm_corpus.tokenizer_cache`)."""
    normalization = normalization or TextNormalization()
    path, key = tokenizer_cache(sources, vocab_size, cache_dir, normalization, sample_bytes, CHUNK_BYTES)
    cached = tokmod.load_cached(path, key)  # None also for a damaged or swapped file (named in a warning)
    if cached is not None:
        return cached

    def chunks():
        return sample_chunks(sources, sample_bytes, CHUNK_BYTES, avoid=normalization.remove)

    normalizer = normalization.normalizer(c.text for c in chunks())  # reads the text for case=corpus_words only
    holder = Tokenizer(models.BPE())
    holder.normalizer = normalizer
    encoder = ChunkEncoder(holder)
    blank = BlankCheck(sources)
    tok = tokmod.train_bpe_from_texts((encoder.normalize(c) for c in blank.watch(chunks())), vocab_size, normalizer)
    blank.raise_if_blank()
    tokmod.save_cached(tok, path, key)
    return tok


def tokenize_corpus(sources: list[TextSource], vocab_size: int, cache_dir: str | os.PathLike,
                    normalization: TextNormalization | None = None,
                    sample_bytes: int = DEFAULT_TOKENIZER_SAMPLE_MB << 20,
                    tokenizer: BPETokenizer | None = None) -> tuple[BPETokenizer, TokenStream]:
    """Tokenizer and the corpus's ids as a :class:`TokenStream` over cached shards, built (or finished, after an
    interrupted run) when missing. Cheap when cached: ``stat`` calls, two small JSON reads, no text read, so
    ``prepare_data`` and ``setup`` (every DDP rank) can both call it. Ids are uint16 when the vocab fits, else
    uint32. ``tokenizer``: a given one (a model folder's), used instead of training one."""
    normalization = normalization or TextNormalization()
    tok = tokenizer or corpus_tokenizer(sources, vocab_size, cache_dir, normalization, sample_bytes)
    out = shards_dir(sources, tok, cache_dir)
    manifest = complete_manifest(out, sources, tok)
    if manifest is None:
        manifest = build_shards(sources, tok, out, avoid=normalization.remove)  # names what it rebuilds
    return tok, TokenStream.open(out, manifest)


# --------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------
def _window(tokens: TokenStream | np.ndarray, start: int, seq_len: int) -> dict[str, torch.Tensor]:
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

    def __init__(self, tokens: TokenStream | np.ndarray, seq_len: int, num_windows: int, seed: int = 0):
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

    def __init__(self, tokens: TokenStream | np.ndarray, seq_len: int):
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
    """Causal-LM data from CPython's pydoc text (offline default) or UTF-8 text: a file, a folder or a glob.

    The corpus is tokenized once into shards under ``cache_dir/tokens`` (resumable; see ``shards``), and every
    process (DDP rank, DataLoader worker) reads its windows from them: memory does not grow with the corpus.

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
        tokenizer_sample_mb: float = DEFAULT_TOKENIZER_SAMPLE_MB,
        # hf (data=hf): the text column (data.hf.text_column) of the dataset's train split; val and test are carved
        # from its end by the fractions, as for a text file
        hf: dict | None = None,
        # a tokenizer file to use instead of training one (init_from= sets it to the model folder's tokenizer.json)
        tokenizer: str | None = None,
    ):
        super().__init__()
        if source not in SOURCES:
            raise ConfigError(f"unknown data source {source!r}; valid sources: {', '.join(SOURCES)}")
        if source == "text_file" and not path:
            raise ConfigError("source='text_file' needs path=<a UTF-8 text file, a folder or a glob>")
        hf = hf_options(source, path, hf)
        if not tokenizer_sample_mb > 0:
            raise ConfigError(f"tokenizer_sample_mb must be > 0, got {tokenizer_sample_mb}")
        if seq_len < 1 or batch_size < 1:
            raise ConfigError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
        fractions_ok = 0 <= val_fraction < 1 and 0 <= test_fraction < 1
        if not (fractions_ok and val_fraction + test_fraction < 1):
            raise ConfigError(
                f"val_fraction={val_fraction} and test_fraction={test_fraction} must be in [0, 1) "
                "and sum to < 1"
            )
        self.normalization = lm_normalization(normalize)
        self.save_hyperparameters()
        self.hparams.normalize = self.normalization.as_dict()
        self.hparams.hf = hf  # hf_options: plain types, every option
        self.tokenizer: BPETokenizer | None = None
        self.vocab_size: int | None = None  # real tokenizer size, known after setup()
        self.train_dataset: RandomWindowDataset | None = None
        self.val_dataset: ConsecutiveWindowDataset | None = None
        self.test_dataset: ConsecutiveWindowDataset | None = None

    def _tokenize(self) -> tuple[BPETokenizer, TokenStream]:
        hp = self.hparams
        sources = text_sources(hp.source, hp.path, hp.hf, hp.cache_dir)
        given = BPETokenizer.given(hp.tokenizer) if hp.get("tokenizer") else None
        return tokenize_corpus(sources, hp.vocab_size, hp.cache_dir, self.normalization,
                               tokenizer_sample_bytes(hp.tokenizer_sample_mb), tokenizer=given)

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
        splits = {  # views of the shards: nothing is read here
            "train": tokens.view(0, n_train),
            "val": tokens.view(n_train, n_train + n_val),
            "test": tokens.view(n_train + n_val, n),
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
