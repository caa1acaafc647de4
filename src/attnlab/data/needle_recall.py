"""Needle recall: a synthetic sequence-classification task whose answer sits far from where it is asked (claim E7).

Generated at setup from ``seed`` (no files, nothing downloaded). One sequence of ``seq_len`` tokens::

    f f f f f f 5 f f f f ... f f f ?        label = 5, the one needle symbol in the sequence
    0 ......... p ............... T-1        distance = T-1 - p

* every position holds a random *filler* symbol (``num_fillers`` of them, ids ``num_classes …``), except
* one *needle*, a symbol ``0 … num_classes-1`` (the label), at position p, and
* the QUERY (id ``num_classes + num_fillers``) at the last position, where the question is asked.

The needle's **distance** to the query, ``T-1 - p``, is uniform in ``[min_distance, max_distance]`` (default: 1 …
T-1, every place it can be). A model that reads its answer at the query position gets it right only if that
position's output depends on the input at distance d: a CNN with receptive field R is at chance (1/num_classes)
once d ≥ R, an RNN has to carry the symbol for d steps, self-attention can look it up at any distance. Accuracy
per distance tells them apart. (The lookup is one hop on purpose: the experiment is about reach, and every encoder
learns it in a few hundred steps on a CPU.)

Items (and, collated, batches): ``{"input_ids": long (T,), "label": long (), "distance": long ()}``.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from .loading import EpochDataLoader, MidEpochResume, shuffled_sampler


def needle_recall(n: int, seq_len: int, num_classes: int, num_fillers: int, generator: torch.Generator | None = None,
                  min_distance: int = 1, max_distance: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``n`` sequences: ``(input_ids (n, seq_len), labels (n,), distances (n,))`` (see the module docstring)."""
    max_distance = seq_len - 1 if max_distance is None else max_distance
    if seq_len < 2 or num_classes < 2 or num_fillers < 1:
        raise ValueError(f"need seq_len >= 2, num_classes >= 2 and num_fillers >= 1, got {seq_len}, {num_classes}, "
                         f"{num_fillers}")
    if not 1 <= min_distance <= max_distance <= seq_len - 1:
        raise ValueError(f"need 1 <= min_distance <= max_distance <= seq_len - 1 = {seq_len - 1}, "
                         f"got {min_distance}, {max_distance}")
    ids = torch.randint(num_classes, num_classes + num_fillers, (n, seq_len), generator=generator)
    labels = torch.randint(0, num_classes, (n,), generator=generator)
    distances = torch.randint(min_distance, max_distance + 1, (n,), generator=generator)
    ids[torch.arange(n), seq_len - 1 - distances] = labels  # the needle
    ids[:, -1] = num_classes + num_fillers  # QUERY
    return ids, labels, distances


def needle_names(ids: list[int], num_classes: int, num_fillers: int) -> list[str]:
    """Readable tokens: needles as their class (``5``), fillers as ``·``, the query as ``?`` (its id follows the
    classes and fillers)."""
    query = num_classes + num_fillers
    return ["?" if i == query else str(i) if i < num_classes else "·" for i in ids]


class SequenceTensorDataset(Dataset):
    def __init__(self, ids: Tensor, labels: Tensor, distances: Tensor):
        self.ids, self.labels, self.distances = ids, labels, distances

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"input_ids": self.ids[i], "label": self.labels[i], "distance": self.distances[i]}


class NeedleRecallDataModule(MidEpochResume, L.LightningDataModule):
    """Train/val/test splits of :func:`needle_recall`, each from its own seed (``seed``, ``seed+1``, ``seed+2``).

    Args:
        seq_len: T, tokens per sequence, the query included.
        num_classes: K needle symbols = classes (chance accuracy 1/K).
        num_fillers: filler symbols.
        vocab_size: the embedding table the model builds (the model config reads ``data.vocab_size``); at least
            ``num_classes + num_fillers + 1`` (the query); larger ids are never used.
        min_distance, max_distance: range of the needle's distance to the query (default 1 … T-1).
        train_size, val_size, test_size: sequences per split.
    """

    def __init__(
        self,
        seq_len: int = 64,
        num_classes: int = 8,
        num_fillers: int = 8,
        vocab_size: int = 17,
        min_distance: int = 1,
        max_distance: int | None = None,
        train_size: int = 16384,
        val_size: int = 2048,
        test_size: int = 4096,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
    ):
        super().__init__()
        needed = num_classes + num_fillers + 1
        if vocab_size < needed:
            raise ValueError(f"vocab_size={vocab_size} < num_classes + num_fillers + 1 = {needed} "
                             "(the needles, the fillers and the query)")
        self.seq_len, self.num_classes, self.num_fillers, self.vocab_size = seq_len, num_classes, num_fillers, vocab_size
        self.query_id = num_classes + num_fillers
        self.min_distance, self.max_distance = min_distance, max_distance
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.batch_size, self.num_workers, self.pin_memory, self.seed = batch_size, num_workers, pin_memory, seed
        needle_recall(1, seq_len, num_classes, num_fillers, None, min_distance, max_distance)  # check arguments now
        self.datasets: dict[str, SequenceTensorDataset] = {}
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        for offset, (split, n) in enumerate(self.sizes.items()):
            g = torch.Generator().manual_seed(self.seed + offset)
            self.datasets[split] = SequenceTensorDataset(*needle_recall(
                n, self.seq_len, self.num_classes, self.num_fillers, g, self.min_distance, self.max_distance))

    def _loader(self, split: str) -> DataLoader:
        if split not in self.datasets:
            raise RuntimeError(f"{type(self).__name__}: call setup() first")
        data = self.datasets[split]
        # training: a (seed, epoch) permutation that DDP ranks split and a mid-epoch resume can skip into
        sampler = shuffled_sampler(data, self.seed) if split == "train" else None
        return EpochDataLoader(data, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                               pin_memory=self.pin_memory, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._resumable(self._loader("train"))

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    # -- helpers for callbacks -------------------------------------------------------------------------------------
    def token_names(self, ids: Tensor) -> list[str]:
        return needle_names(ids.tolist(), self.num_classes, self.num_fillers)

    def example(self, index: int = 0) -> dict[str, Tensor]:
        """A fixed validation sequence (batch of one): ``{"input_ids": (1, T), "label": (1,), "distance": (1,)}``."""
        if "val" not in self.datasets:
            raise RuntimeError(f"{type(self).__name__}: call setup() first")
        return {k: v[None] for k, v in self.datasets["val"][index].items()}
