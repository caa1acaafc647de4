"""Epoch-aware loading shared by the data modules: seeded epoch plans, whole-batch plans, DDP and mid-epoch resume.

Every training order here is a function of ``(seed, epoch)`` only, never of a global RNG, a worker or a DDP rank.
That is what makes three guarantees possible:

* DDP equivalence: ranks split one plan, so W ranks × B examples per step train on what one process × W·B (or one
  process × B with ``accumulate_grad_batches=W``, for whole-batch plans) trains on;
* exact resume: a checkpoint records how far into its epoch training was (:class:`MidEpochResume`), and the resumed
  loader skips exactly those batches of the same plan;
* the same batches with any number of DataLoader workers.

Lightning calls ``set_epoch`` on samplers (not datasets) every epoch; :class:`EpochDataLoader` passes the epoch on
to a dataset that needs it (window offsets, batch plans).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    Sampler,
    SequentialSampler,
)


_MASK64 = (1 << 64) - 1


def mix64(*values: int) -> int:
    """splitmix64-style hash of a tuple of ints: a well-spread 63-bit seed, e.g. for ``(seed, epoch, index)``."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & _MASK64
        h ^= h >> 29
    return h >> 1


def distributed() -> bool:
    """True inside a DDP process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class EpochSampler(SequentialSampler):
    """Sequential order plus ``set_epoch``, which Lightning calls on samplers every epoch.

    Under DDP a ``DistributedSampler(shuffle=False)`` takes its place; it also has ``.epoch``, and
    :class:`EpochDataLoader` reads the epoch from whichever sampler it has.
    """

    def __init__(self, data_source: Dataset):
        super().__init__(data_source)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class FrozenEpochSampler(EpochSampler):
    def set_epoch(self, epoch: int) -> None:  # always epoch 0's plan (Trainer(overfit_batches=...))
        self.epoch = 0


class StridedSampler(DistributedSampler):
    """``DistributedSampler(shuffle=False)``'s order without its list of every index: rank r yields r, r+W, …
    lazily (padded by wrapping around, as it pads), so a rank's sampler costs nothing however many windows an
    epoch of a large corpus has."""

    def __iter__(self):
        if self.shuffle:
            return super().__iter__()
        n = len(self.dataset)
        return (i % n for i in range(self.rank, self.total_size, self.num_replicas))


def sequential_sampler(dataset: Dataset, drop_last: bool = False) -> Sampler:
    """The train sampler of a dataset whose items already carry the epoch's randomness (windows, batch plans).

    Under DDP each rank takes every world_size-th item (Lightning keeps a DistributedSampler it is given), so one
    step of W ranks covers exactly the items of W consecutive single-process items.
    """
    if distributed():
        return StridedSampler(dataset, shuffle=False, drop_last=drop_last)
    return EpochSampler(dataset)


def shuffled_sampler(dataset: Dataset, seed: int) -> DistributedSampler:
    """A permutation of ``dataset`` seeded by ``seed + epoch``, the same permutation in 1 process and under DDP.

    A single process gets a one-replica ``DistributedSampler`` instead of a ``RandomSampler`` (which draws from the
    global RNG): rank r of W then takes items ``r, r+W, …`` of the very permutation a single process walks through,
    so a step of W ranks × B items trains on the items of one step of a single process with W·B.
    """
    if distributed():
        return DistributedSampler(dataset, shuffle=True, seed=seed)
    return DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)


class EpochDataLoader(DataLoader):
    """Passes the sampler's epoch to the dataset each time an epoch's iteration begins.

    ``resume_at = (epoch, n)`` (see :class:`MidEpochResume`): the first iteration of that epoch skips its first
    ``n`` batches, the ones the interrupted run already trained on, so a resumed run sees exactly the batches the
    uninterrupted run would.
    """

    resume_at: tuple[int, int] | None = None

    def __init__(self, *args, **kwargs):
        # Its own generator for the iterator's base seed: otherwise each new iterator (each epoch, each validation)
        # draws it from the global generator, and a run resumed at an epoch start, whose iterator Lightning makes
        # before that point, would draw its dropout masks one number off the uninterrupted run's.
        if kwargs.get("generator") is None:
            kwargs["generator"] = torch.Generator().manual_seed(torch.initial_seed() & (2**63 - 1))
        super().__init__(*args, **kwargs)

    def __iter__(self):
        epoch = getattr(self.sampler, "epoch", None)
        if epoch is not None and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        it = super().__iter__()
        if self.resume_at is not None and self.resume_at[0] == (epoch or 0):
            n, self.resume_at = self.resume_at[1], None
            for _ in range(n):  # batches are functions of (seed, epoch, index): skipping draws no randomness
                next(it, None)
        return it


class MidEpochResume:
    """Data-module mixin: checkpoints record how far into its epoch training was; resuming continues there.

    Lightning saves ``state_dict()`` in every checkpoint and hands it back to ``load_state_dict()`` before it
    builds the dataloaders; ``train_dataloader()`` then calls :meth:`_resumable` on its loader.
    """

    _resume_at: tuple[int, int] | None = None

    def state_dict(self) -> dict:
        trainer = getattr(self, "trainer", None)
        if trainer is None or trainer.state.fn != "fit":
            return {}
        from ..checkpoints.loop_position import record

        # the epoch training continues in and its batches already trained (the next epoch and 0 at an epoch's end)
        pos = record(trainer)
        return {"epoch": pos["epoch"], "batches_done": pos["batches_done"]}

    def load_state_dict(self, state: dict) -> None:
        if "epoch" in state:
            self._resume_at = (int(state["epoch"]), int(state["batches_done"]))

    def resume_from(self, epoch: int, batches_done: int) -> None:
        """Where the checkpoint being loaded continues (``ExactResume``: from its position record, or from its loop
        counters where it has none)."""
        self._resume_at = (int(epoch), int(batches_done))

    def _resumable(self, loader: DataLoader) -> DataLoader:
        if self._resume_at is not None and isinstance(loader, EpochDataLoader):
            loader.resume_at, self._resume_at = self._resume_at, None
            # Lightning makes this loader's iterator (and fetches a batch) before it tells the sampler the epoch:
            # tell it now, or a run resumed after epoch 0 would start with epoch 0's order and plan.
            for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(loader.resume_at[0])
        return loader


# --------------------------------------------------------------------------------------
# Whole-batch plans (variable-length data: translation pairs, utterances)
# --------------------------------------------------------------------------------------
class BatchDataset(Dataset):
    """A dataset of whole batches: item ``i`` is the collated ``i``-th batch of the current epoch's plan.

    The plan (which examples form which batch) is a function of ``(seed, epoch)`` only, so it does not depend on
    worker or DDP rank; under DDP a sampler over *batches* gives each rank different whole batches. With
    ``shuffle`` the examples are permuted each epoch and, with ``sort_keys``, cut into pools of ``pool`` batches
    sorted by those keys (lengths: little padding), then the batch order is permuted. Without ``shuffle`` (or with
    ``frozen``) the plan is fixed: sorted over the whole split, or in split order. The epoch lives in a
    shared-memory tensor so that ``set_epoch`` in the main process reaches persistent workers.

    Args:
        sort_keys: per-example arrays, most significant first (e.g. ``(src_lens, tgt_lens)``); None: no sorting.
        collate: turns a list of examples into a batch.
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, shuffle: bool, collate: Callable[[list], dict],
                 sort_keys: Sequence[np.ndarray] | None = None, pool: int = 50, seed: int = 0,
                 frozen: bool = False):  # fmt: skip
        if batch_size < 1 or pool < 1:
            raise ValueError(f"batch_size and pool must be >= 1, got {batch_size}, {pool}")
        self.dataset, self.batch_size, self.pool, self.collate = dataset, batch_size, pool, collate
        self.shuffle, self.seed = shuffle, seed
        self.sort_keys = [np.asarray(k) for k in sort_keys] if sort_keys is not None else None
        self.frozen = frozen  # always epoch 0's plan (Trainer(overfit_batches=...): the same batches every epoch)
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._plan: tuple[int, list[np.ndarray]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    @property
    def epoch(self) -> int:
        return int(self._epoch) if self.shuffle and not self.frozen else 0

    def _sorted(self, idx: np.ndarray) -> np.ndarray:
        if self.sort_keys is None:
            return idx
        return idx[np.lexsort([k[idx] for k in reversed(self.sort_keys)])]  # lexsort: last key most significant

    def plan(self, epoch: int | None = None) -> list[np.ndarray]:
        """The batches (arrays of example indices) of ``epoch`` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        if self._plan is not None and self._plan[0] == epoch:
            return self._plan[1]
        n, B = len(self.dataset), self.batch_size
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch])
            order = rng.permutation(n)
            if self.sort_keys is not None:
                chunk = B * self.pool
                order = np.concatenate([self._sorted(order[i : i + chunk]) for i in range(0, n, chunk)])
            batches = [order[i : i + B] for i in range(0, n, B)]
            batches = [batches[j] for j in rng.permutation(len(batches))]
        else:
            order = self._sorted(np.arange(n))
            batches = [order[i : i + B] for i in range(0, n, B)]
        self._plan = (epoch, batches)
        return batches

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.batch_size)

    def __getitem__(self, i: int) -> dict:
        batches = self.plan()
        if not 0 <= i < len(batches):
            raise IndexError(i)
        return self.collate([self.dataset[int(j)] for j in batches[i]])


def _no_collate(batch):
    return batch  # items are already batches (module-level, so workers can pickle it)


def batch_loader(batches: BatchDataset, train: bool, num_workers: int = 0, pin_memory: bool = False) -> EpochDataLoader:
    """A loader over a :class:`BatchDataset`. Training under DDP: rank r takes plan batches r, r+W, …, so one step
    of W ranks trains on W consecutive batches of the plan, as one process with ``accumulate_grad_batches=W``."""
    sampler = sequential_sampler(batches) if train else EpochSampler(batches)
    return EpochDataLoader(batches, batch_size=None, sampler=sampler, collate_fn=_no_collate,
                           num_workers=num_workers, pin_memory=pin_memory, persistent_workers=num_workers > 0)
