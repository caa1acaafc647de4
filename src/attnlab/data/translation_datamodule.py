"""Sequence-to-sequence translation data: number words (``source="numbers"``) or a user's TSV corpus (``"tsv"``).

Pipeline (everything cached under ``cache_dir``)::

    numbers: num2words -> <cache_dir>/numbers/<key>/{train,val,test[,copy_test]}.tsv     (numbers.py)
    tsv:     read_parallel_tsv(path) -> split by seed, grouped by source sentence    (parallel.py)
    "\\n".join(normalized train sources and targets) --train_or_load_bpe--> one joint tokenizer  (tokenizer.py)

One **joint** byte-level BPE serves both languages (trained on the training split only, both sides): one vocabulary
and one set of special ids (``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3), so a model may tie encoder,
decoder and output embeddings, and copying a name is predicting the very ids it read. ``src_vocab_size ==
tgt_vocab_size == vocab_size``. For the numbers the vocabulary is closed and small, so with the default cap every
word becomes one token (word-level in effect); a hyphen is its own token ("twenty-one" -> "twenty", "-", "one").

Normalization (``data.normalize``, see ``normalization.py``) applies to the **source side only**: the tokenizer
stores it and ``encode`` applies it to every source (training, validation, ``encode_sources`` that ``translate``
uses), while targets are encoded verbatim (``encode(t, normalize=False)``). The targets are the exact references
of BLEU and exact match (``decode(encode(t)) == t`` must hold), and they carry case and characters that a source
normalization would destroy: German nouns ("eine Million"), names copied from the source (claim E15), a TSV
corpus' capitals and punctuation. Default per source (``DEFAULT_NORMALIZATION``): numbers fold NFKC, punctuation,
spaces and the case of the number words, and write "twenty one" as "twenty-one"; a TSV corpus only NFC and whitespace.

A batch (``collate``) is a dict, padded per batch to its longest sequence::

    src       LongTensor[B, S]   source ids (+ <eos> when src_eos), right-padded with <pad>
    src_mask  BoolTensor[B, S]   True at real tokens
    tgt_in    LongTensor[B, T]   <bos> + target ids       (decoder input, teacher forcing)
    tgt_out   LongTensor[B, T]   target ids + <eos>        (labels; <pad> = ignore_index)
    tgt_mask  BoolTensor[B, T]   True at real tokens of tgt_in / tgt_out
    bucket    LongTensor[B]      source-length bucket (``bucket_names``) for per-bucket accuracy
    src_text, tgt_text           list[str]: the untokenized pair, for BLEU / exact match on detokenized text

Training batches are shuffled each epoch by ``(seed, epoch)``; with ``sort_by_length`` they are cut from pools of
``bucket_pool`` batches sorted by length, so padding is small. Val/test/copy_test batches are deterministic (sorted
by length when ``sort_by_length``, else in split order); the last batch may be smaller.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from ..core.errors import ConfigError, DataError
from attnlab.data.hf_source import hf_options
from attnlab.data.loading import BatchDataset, MidEpochResume, batch_loader
from attnlab.data.normalization import TextNormalization
from attnlab.data.numbers import SPOKEN_COMPOUNDS, load_or_generate_numbers
from attnlab.data.parallel import DEFAULT_BUCKET_EDGES, Pair, bucket_names, check_bucket_edges
from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, BPETokenizer, train_or_load_bpe
from attnlab.data.user_pairs import read_user_pairs, tsv_files, user_splits

log = logging.getLogger(__name__)

SOURCES = ("numbers", "tsv", "hf")
# Source-side normalization when the config declares none (conf/data/{numbers,tsv}.yaml declare these explicitly).
# numbers: the corpus is num2words' English without commas, lower case, single spaces; a user's "Three hundred and
# five." or num2words' own "one million, two hundred" must reach the model as that training form. Case is folded
# for the number words only (corpus_words), so that the names of copy pairs keep their capital (claim E15).
DEFAULT_NORMALIZATION = {
    "numbers": {"unicode": "NFKC", "remove": ",.;:!?", "whitespace": True, "case": "corpus_words",
                "replace": [list(SPOKEN_COMPOUNDS)]},  # conf/data/numbers.yaml says the same (tested)
    "tsv": {"unicode": "NFC", "remove": "", "whitespace": True, "case": "keep"},
}
DEFAULT_NORMALIZATION["hf"] = DEFAULT_NORMALIZATION["tsv"]


# --------------------------------------------------------------------------------------
# Datasets and batching
# --------------------------------------------------------------------------------------
class TranslationDataset(Dataset):
    """Encoded pairs: item ``i`` is ``{"src", "tgt", "src_text", "tgt_text", "bucket"}``.

    ``src`` already ends with <eos> when the data module's ``src_eos`` is set; ``tgt`` has no markers (``collate``
    adds them). Ids live in two flat int32 arrays with offsets (cheap to pickle to workers).
    """

    def __init__(self, pairs: Sequence[Pair], src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]]):
        if not len(pairs) == len(src_ids) == len(tgt_ids):
            raise ValueError("pairs, src_ids and tgt_ids must have the same length")
        self.pairs = list(pairs)
        self.src_lens = np.array([len(s) for s in src_ids], dtype=np.int64)
        self.tgt_lens = np.array([len(t) for t in tgt_ids], dtype=np.int64)
        self._src = np.fromiter((i for s in src_ids for i in s), dtype=np.int32, count=int(self.src_lens.sum()))
        self._tgt = np.fromiter((i for t in tgt_ids for i in t), dtype=np.int32, count=int(self.tgt_lens.sum()))
        self._src_off = np.concatenate([[0], np.cumsum(self.src_lens)])
        self._tgt_off = np.concatenate([[0], np.cumsum(self.tgt_lens)])

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)
        p = self.pairs[i]
        src = self._src[self._src_off[i] : self._src_off[i + 1]]
        tgt = self._tgt[self._tgt_off[i] : self._tgt_off[i + 1]]
        return {
            "src": torch.from_numpy(src.astype(np.int64)),
            "tgt": torch.from_numpy(tgt.astype(np.int64)),
            "src_text": p.src,
            "tgt_text": p.tgt,
            "bucket": p.bucket,
        }


def collate(items: Sequence[dict], pad_id: int = PAD_ID, bos_id: int = BOS_ID, eos_id: int = EOS_ID) -> dict:
    """Pad a list of ``TranslationDataset`` items into one batch (see the module doc for the keys)."""
    B = len(items)
    S = max(len(it["src"]) for it in items)
    T = max(len(it["tgt"]) for it in items) + 1
    src = torch.full((B, S), pad_id, dtype=torch.long)
    tgt_in = torch.full((B, T), pad_id, dtype=torch.long)
    tgt_out = torch.full((B, T), pad_id, dtype=torch.long)
    src_mask = torch.zeros((B, S), dtype=torch.bool)
    tgt_mask = torch.zeros((B, T), dtype=torch.bool)
    for b, it in enumerate(items):
        s, t = it["src"], it["tgt"]
        src[b, : len(s)] = s
        src_mask[b, : len(s)] = True
        tgt_in[b, 0] = bos_id
        tgt_in[b, 1 : len(t) + 1] = t
        tgt_out[b, : len(t)] = t
        tgt_out[b, len(t)] = eos_id
        tgt_mask[b, : len(t) + 1] = True
    return {
        "src": src,
        "src_mask": src_mask,
        "tgt_in": tgt_in,
        "tgt_out": tgt_out,
        "tgt_mask": tgt_mask,
        "bucket": torch.tensor([int(it["bucket"]) for it in items], dtype=torch.long),
        "src_text": [it["src_text"] for it in items],
        "tgt_text": [it["tgt_text"] for it in items],
    }


def encode_sources(tokenizer: BPETokenizer, texts: Sequence[str], src_eos: bool = True) -> tuple[Tensor, Tensor]:
    """(src (B, S), src_mask (B, S)) for raw source sentences, encoded and padded as in training batches (the
    tokenizer's normalization applied, as to the training sources)."""
    return source_batch(tokenizer.encode_batch(list(texts)), tokenizer, src_eos)


def source_batch(token_ids: Sequence[Sequence[int]], tokenizer: BPETokenizer,
                 src_eos: bool = True) -> tuple[Tensor, Tensor]:
    """(src (B, S), src_mask (B, S)) for encoded source sentences (+ <eos> when the model was trained with it),
    padded by :func:`collate` as a training batch's sources are."""
    eos = [tokenizer.eos_id] if src_eos else []
    items = [{"src": torch.tensor(list(ids) + eos, dtype=torch.long), "tgt": torch.zeros(0, dtype=torch.long),
              "src_text": "", "tgt_text": "", "bucket": 0} for ids in token_ids]
    batch = collate(items, pad_id=tokenizer.pad_id)
    return batch["src"], batch["src_mask"]


# --------------------------------------------------------------------------------------
# DataModule
# --------------------------------------------------------------------------------------
class TranslationDataModule(MidEpochResume, L.LightningDataModule):
    """English number words -> French/German (``source="numbers"``), or a user's corpus: a TSV (``source="tsv"``)
    or a Hugging Face dataset (``source="hf"``, data/hf_source.py).

    ``vocab_size`` is the tokenizer's size cap (what the model config reads, like the LM data); the real size is
    ``self.vocab_size`` after ``setup()``. ``seq_len`` bounds both sides: ``len(src) <= seq_len`` (with <eos>)
    and ``len(tgt_in) == len(tgt_out) <= seq_len``. Numbers longer than that are an error (the splits keep their
    exact sizes); TSV pairs longer than that are dropped with a warning. The actual longest lengths are
    ``max_src_len`` and ``max_tgt_len``.

    Usable without a Trainer: ``dm.prepare_data(); dm.setup("fit")``.
    """

    def __init__(
        self,
        source: str = "numbers",
        # numbers
        target_lang: str = "fr",
        max_digits: int = 7,
        train_size: int = 20000,
        val_size: int = 1000,
        test_size: int = 1000,
        copy_names: bool = False,
        copy_fraction: float = 0.1,
        copy_test_size: int = 500,
        # tsv
        path: str | None = None,
        val_path: str | None = None,
        test_path: str | None = None,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        # hf (Hugging Face datasets at `path`): name, split, src_column/tgt_column or translation_column with
        # src_lang/tgt_lang, datasets_cache (see conf/data/hf.yaml and data/hf_source.py)
        hf: dict | None = None,
        # all
        bucket_edges: Iterable[int] = DEFAULT_BUCKET_EDGES,
        normalize: dict | None = None,
        vocab_size: int = 512,
        seq_len: int = 64,
        src_eos: bool = True,
        batch_size: int = 64,
        sort_by_length: bool = True,
        bucket_pool: int = 50,
        num_workers: int = 0,
        pin_memory: bool = False,
        cache_dir: str = ".cache",
        seed: int = 0,
    ):
        super().__init__()
        if source not in SOURCES:
            raise ConfigError(f"unknown data source {source!r}; valid sources: {', '.join(SOURCES)}")
        if source == "tsv":
            tsv_files(path, val_path, test_path)  # (a missing path: one line now, not at setup)
        hf = hf_options(source, path, hf)
        if source != "numbers" and copy_names:
            raise ConfigError("copy_names applies to source='numbers' only")
        if seq_len < 2 or batch_size < 1:
            raise ConfigError(f"seq_len must be >= 2 and batch_size >= 1, got {seq_len}, {batch_size}")
        bucket_edges = check_bucket_edges(bucket_edges)
        # source-side normalization (see the module doc); None: the source's default
        self.normalization = TextNormalization.from_config(DEFAULT_NORMALIZATION[source] if normalize is None
                                                           else normalize)
        self.save_hyperparameters()
        self.hparams.bucket_edges = list(bucket_edges)
        self.hparams.normalize = self.normalization.as_dict()
        self.hparams.hf = hf  # hf_options: plain types, every option
        self.bucket_names: list[str] = bucket_names(bucket_edges)
        self.tokenizer: BPETokenizer | None = None
        self.vocab_size: int | None = None  # real tokenizer size, known after setup()
        self.splits: dict[str, list[Pair]] = {}
        self.datasets: dict[str, TranslationDataset] = {}
        self.max_src_len: int | None = None
        self.max_tgt_len: int | None = None
        self.cache_path = None  # numbers: the directory of the cached split files

    # -- loading -------------------------------------------------------------------------
    def _load_splits(self) -> dict[str, list[Pair]]:
        hp = self.hparams
        if hp.source == "numbers":
            splits, self.cache_path = load_or_generate_numbers(
                hp.cache_dir, target_lang=hp.target_lang, max_digits=hp.max_digits, train_size=hp.train_size,
                val_size=hp.val_size, test_size=hp.test_size, seed=hp.seed, copy_names=hp.copy_names,
                copy_fraction=hp.copy_fraction, copy_test_size=hp.copy_test_size, bucket_edges=hp.bucket_edges,
            )  # fmt: skip
            return splits
        given = read_user_pairs(hp.source, hp.path, hp.val_path, hp.test_path, hp.hf, hp.bucket_edges)
        return user_splits(given, hp.path, hp.val_fraction, hp.test_fraction, hp.seed)

    def _tokenizer(self, splits: dict[str, list[Pair]]) -> BPETokenizer:
        """The joint tokenizer, trained on the train split's normalized sources and verbatim targets; it stores the
        normalizer. ``case=corpus_words`` reads the words of every split's sources (e.g. "zero", whose integer
        may be in val or test only: the word is then folded too, though its translation was never trained)."""
        train = splits["train"]
        normalizer = self.normalization.normalizer(p.src for pairs in splits.values() for p in pairs)
        text = "\n".join(f"{normalizer.normalize_str(p.src)}\n{p.tgt}" for p in train) + "\n"
        return train_or_load_bpe(text, self.hparams.vocab_size, self.hparams.cache_dir, normalizer)

    def prepare_data(self) -> None:
        """Generate/read the splits and train the tokenizer into the cache (rank 0 under DDP)."""
        self._tokenizer(self._load_splits())

    def setup(self, stage: str | None = None) -> None:
        """Load splits and tokenizer (cheap once cached), encode every split, check lengths."""
        if self.tokenizer is not None:
            return
        hp = self.hparams
        splits = self._load_splits()
        tok = self._tokenizer(splits)
        eos = [tok.eos_id] if hp.src_eos else []
        self.splits, self.datasets = {}, {}
        for name, pairs in splits.items():
            src_ids = [ids + eos for ids in tok.encode_batch([p.src for p in pairs])]
            tgt_ids = tok.encode_batch([p.tgt for p in pairs], normalize=False)  # exact references
            keep = [i for i in range(len(pairs)) if len(src_ids[i]) <= hp.seq_len and len(tgt_ids[i]) < hp.seq_len]
            if len(keep) < len(pairs):
                kept = set(keep)
                first = next(i for i in range(len(pairs)) if i not in kept)
                what = (f"{len(pairs) - len(keep)} of {len(pairs)} {name} pairs are longer than seq_len={hp.seq_len} "
                        f"tokens (e.g. {pairs[first].src!r})")  # fmt: skip
                if hp.source == "numbers":
                    raise ConfigError(f"{what}; use a larger seq_len")
                log.warning(f"{what}: dropped")
                if not keep:
                    raise DataError(f"the {name} split is empty after dropping pairs longer than seq_len")
                pairs = [pairs[i] for i in keep]
                src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
            self.splits[name] = pairs
            self.datasets[name] = TranslationDataset(pairs, src_ids, tgt_ids)
        self.max_src_len = max(int(ds.src_lens.max()) for ds in self.datasets.values())
        self.max_tgt_len = max(int(ds.tgt_lens.max()) for ds in self.datasets.values()) + 1
        self.tokenizer, self.vocab_size = tok, tok.vocab_size

    # -- attributes ------------------------------------------------------------------------
    @property
    def src_vocab_size(self) -> int | None:
        return self.vocab_size

    @property
    def tgt_vocab_size(self) -> int | None:
        return self.vocab_size

    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

    @property
    def train_dataset(self) -> TranslationDataset | None:
        return self.datasets.get("train")

    @property
    def val_dataset(self) -> TranslationDataset | None:
        return self.datasets.get("val")

    @property
    def test_dataset(self) -> TranslationDataset | None:
        return self.datasets.get("test")

    @property
    def copy_test_dataset(self) -> TranslationDataset | None:
        return self.datasets.get("copy_test")

    # -- loaders ---------------------------------------------------------------------------
    def _require(self, split: str) -> TranslationDataset:
        if not self.datasets:
            raise RuntimeError("TranslationDataModule: call prepare_data() and setup() first")
        if split not in self.datasets:
            raise RuntimeError(f"no {split} split: it needs data=numbers with data.copy_names=true")
        return self.datasets[split]

    def _loader(self, split: str, train: bool) -> DataLoader:
        hp = self.hparams
        overfit = train and self.trainer is not None and bool(self.trainer.overfit_batches)
        ds = self._require(split)
        batches = BatchDataset(ds, hp.batch_size, shuffle=train, collate=collate, pool=hp.bucket_pool, seed=hp.seed,
                               sort_keys=(ds.src_lens, ds.tgt_lens) if hp.sort_by_length else None, frozen=overfit)
        return batch_loader(batches, train, hp.num_workers, hp.pin_memory)

    def train_dataloader(self) -> DataLoader:
        return self._resumable(self._loader("train", train=True))

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        """The test split; with ``copy_names`` also the copy_test split (``dataloader_idx`` 1 in ``test_step``)."""
        if "copy_test" in self.datasets:
            return [self._loader("test", train=False), self._loader("copy_test", train=False)]
        return self._loader("test", train=False)

    def copy_test_dataloader(self) -> DataLoader:
        """Pairs embedding held-out names (claim E15); needs ``copy_names=True``."""
        return self._loader("copy_test", train=False)

    # -- helpers for models, metrics and callbacks -----------------------------------------
    def example_pair(self) -> dict:
        """A fixed val pair as a batch of one (for attention maps): the first one of median source length."""
        ds = self._require("val")
        median = int(np.sort(ds.src_lens)[len(ds) // 2])
        i = int(np.flatnonzero(ds.src_lens == median)[0])
        return collate([ds[i]])

    def _tok(self) -> BPETokenizer:
        if self.tokenizer is None:
            raise RuntimeError("TranslationDataModule: call setup() first")
        return self.tokenizer
