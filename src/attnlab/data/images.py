"""What the image-classification data sets share: a stratified split, plain-torch augmentation, a tensor-backed
dataset and a LightningDataModule base class.

Every item (and, collated, every batch) is ``{"image": float (C, H, W), "label": long ()}``: the image scaled to
[0, 1], resized to ``image_size`` if that differs from the stored size, augmented (train split only), then
normalized per channel with the *train* split's mean and standard deviation.
"""

from __future__ import annotations

from typing import Callable, Sequence

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from ..core.errors import ConfigError
from attnlab.data.loading import EpochDataLoader, FrozenEpochSampler, MidEpochResume, mix64, shuffled_sampler


def stratified_split(labels: Sequence[int] | np.ndarray, fractions: Sequence[float], seed: int = 0) -> list[np.ndarray]:
    """Split indices ``0..N-1`` into ``len(fractions)`` disjoint parts with each class in the same proportions.

    ``fractions`` (summing to 1) are per class; the first part takes what rounding leaves. Deterministic for a
    given ``seed``; each part's indices are sorted.
    """
    labels = np.asarray(labels)
    fr = np.asarray(fractions, dtype=np.float64)
    if fr.ndim != 1 or len(fr) < 1 or (fr < 0).any() or not np.isclose(fr.sum(), 1.0):
        raise ValueError(f"fractions must be non-negative and sum to 1, got {list(fractions)}")
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in fr]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        sizes = [int(round(len(idx) * f)) for f in fr[1:]]
        if sum(sizes) > len(idx):  # rounding up in every later part: take it back from the last ones
            sizes = [min(s, len(idx) - sum(sizes[:i])) for i, s in enumerate(sizes)]
        bounds = np.cumsum([len(idx) - sum(sizes), *sizes])[:-1]
        for part, chunk in zip(parts, np.split(idx, bounds)):
            part.append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


# ---------------------------------------------------------------------------------------------------------------
# Augmentation, plain torch, one (C, H, W) image at a time. The random numbers come from ``generator`` (the dataset
# seeds one per (seed, epoch, item): the same crops in any worker, any DDP rank, and after a resume); without one,
# from the global torch RNG.
# ---------------------------------------------------------------------------------------------------------------
Augmentation = Callable[[Tensor, "torch.Generator | None"], Tensor]  # (image (C, H, W), generator) -> image


class RandomCrop:
    """Pad by ``padding`` pixels of ``fill`` on every side, then cut a random H×W window: a shift of up to
    ``padding`` pixels in each direction."""

    def __init__(self, padding: int, fill: float = 0.0):
        self.padding, self.fill = int(padding), float(fill)

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        p = self.padding
        if p <= 0:
            return x
        _, h, w = x.shape
        padded = F.pad(x, (p, p, p, p), value=self.fill)
        i, j = torch.randint(0, 2 * p + 1, (2,), generator=generator).tolist()
        return padded[:, i : i + h, j : j + w]


class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return x.flip(-1) if torch.rand((), generator=generator) < self.p else x


class Compose:
    def __init__(self, transforms: Sequence[Augmentation]):
        self.transforms = list(transforms)

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        for t in self.transforms:
            x = t(x, generator)
        return x


def build_augmentation(crop_padding: int = 0, hflip: bool = False) -> Augmentation | None:
    transforms: list[Augmentation] = []
    if crop_padding > 0:
        transforms.append(RandomCrop(crop_padding))
    if hflip:
        transforms.append(RandomHorizontalFlip())
    return Compose(transforms) if transforms else None


# ---------------------------------------------------------------------------------------------------------------
class ImageTensorDataset(Dataset):
    """Images stored as one tensor (N, C, H, W) (uint8 or float) and labels (N,).

    Item i: ``images[i] * scale`` (to [0, 1]) -> resized to ``image_size`` (bilinear) if needed -> ``transform``
    -> ``(x - mean) / std`` per channel. The transform draws from a generator seeded by ``(seed, epoch, key)``
    (``key``: the item's index in the epoch), so an epoch's crops do not depend on workers, ranks or resumes; the
    epoch is a shared-memory tensor so that ``set_epoch`` reaches persistent workers.
    """

    def __init__(self, images: Tensor, labels: Tensor, *, scale: float, mean: Tensor, std: Tensor,
                 image_size: int | None = None, transform: Augmentation | None = None, seed: int = 0):
        if images.dim() != 4 or len(images) != len(labels):
            raise ValueError(f"expected images (N, C, H, W) and labels (N,), got {tuple(images.shape)}, "
                             f"{tuple(labels.shape)}")
        self.images, self.labels = images, labels.long()
        self.scale, self.transform = scale, transform
        self.mean, self.std = mean.view(-1, 1, 1).float(), std.view(-1, 1, 1).float()
        self.image_size, self.seed = image_size, seed
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(int(epoch))

    def __len__(self) -> int:
        return len(self.labels)

    def raw(self, i: int) -> Tensor:
        """Image i in [0, 1] at ``image_size``, not augmented, not normalized: (C, H, W)."""
        x = self.images[i].float() * self.scale
        if self.image_size is not None and x.shape[-2:] != (self.image_size, self.image_size):
            x = F.interpolate(x[None], size=(self.image_size, self.image_size), mode="bilinear",
                              align_corners=False)[0]
        return x

    def item(self, i: int, key: int) -> dict[str, Tensor]:
        """Image i, augmented with the random numbers of epoch item ``key``."""
        x = self.raw(i)
        if self.transform is not None:
            x = self.transform(x, torch.Generator().manual_seed(mix64(self.seed, int(self._epoch), key)))
        return {"image": (x - self.mean) / self.std, "label": self.labels[i]}

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return self.item(i, key=i)


class RepeatedDataset(Dataset):
    """``repeats`` passes over ``dataset`` as one epoch (item i is ``dataset[i % len(dataset)]``): with shuffling and
    augmentation every pass sees other crops, and a small data set still gets long epochs (fewer validations)."""

    def __init__(self, dataset: Dataset, repeats: int):
        if repeats < 1:
            raise ValueError(f"repeats_per_epoch must be >= 1, got {repeats}")
        self.dataset, self.repeats = dataset, repeats

    def __len__(self) -> int:
        return len(self.dataset) * self.repeats

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(i)
        if hasattr(self.dataset, "item"):  # pass i on: the r-th pass over an image gets its own crop
            return self.dataset.item(i % len(self.dataset), key=i)
        return self.dataset[i % len(self.dataset)]


def channel_stats(images: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Per-channel mean and std of ``images * scale`` over (N, H, W), accumulated in float64 (no float copy)."""
    n = images.shape[0] * images.shape[2] * images.shape[3]
    total = torch.zeros(images.shape[1], dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    for chunk in images.split(4096):
        c = chunk.to(torch.float64)
        total += c.sum(dim=(0, 2, 3))
        total_sq += (c * c).sum(dim=(0, 2, 3))
    mean = total / n
    std = (total_sq / n - mean * mean).clamp_min(0).sqrt()
    return (mean * scale).float(), (std * scale).float().clamp_min(1e-6)


class ImageClassificationDataModule(MidEpochResume, L.LightningDataModule):
    """Base class: a subclass implements :meth:`load_splits`; the rest (normalization, augmentation, loaders, the
    fixed example image for attention maps) lives here.

    Attributes the model config reads from ``data.*`` (``num_classes``, ``image_size``, ``in_channels``) are
    constructor arguments, checked against the data at ``setup``. ``repeats_per_epoch`` makes one training epoch
    that many (shuffled, augmented) passes over the train split.
    """

    #: name shown in error messages
    dataset_name = "images"

    def __init__(
        self,
        image_size: int,
        in_channels: int,
        num_classes: int,
        batch_size: int = 64,
        num_workers: int = 0,
        augment: bool = True,
        crop_padding: int = 0,
        hflip: bool = False,
        seed: int = 0,
        pin_memory: bool = False,
        repeats_per_epoch: int = 1,
    ):
        super().__init__()
        if repeats_per_epoch < 1:
            raise ConfigError(f"repeats_per_epoch must be >= 1, got {repeats_per_epoch}")
        if image_size < 1 or batch_size < 1:
            raise ConfigError(f"image_size and batch_size must be >= 1, got {image_size}, {batch_size}")
        self.image_size, self.in_channels, self.num_classes = image_size, in_channels, num_classes
        self.batch_size, self.num_workers, self.pin_memory = batch_size, num_workers, pin_memory
        self.augment, self.crop_padding, self.hflip, self.seed = augment, crop_padding, hflip, seed
        self.repeats_per_epoch = repeats_per_epoch
        self.class_names: list[str] = [str(i) for i in range(num_classes)]
        self.mean: Tensor | None = None
        self.std: Tensor | None = None
        self.train_dataset: ImageTensorDataset | None = None
        self.val_dataset: ImageTensorDataset | None = None
        self.test_dataset: ImageTensorDataset | None = None

    # -- to implement ---------------------------------------------------------------------------------------------
    def load_splits(self) -> tuple[dict[str, tuple[Tensor, Tensor]], float, list[str]]:
        """``({"train"|"val"|"test": (images (N, C, H, W), labels (N,))}, scale to [0, 1], class names)``."""
        raise NotImplementedError

    # -- Lightning hooks ------------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.train_dataset is not None:
            return
        splits, scale, class_names = self.load_splits()
        train_images = splits["train"][0]
        if train_images.shape[1] != self.in_channels:
            raise ConfigError(f"{self.dataset_name} images have {train_images.shape[1]} channels, "
                             f"but in_channels={self.in_channels}")
        if len(class_names) != self.num_classes:
            raise ConfigError(f"{self.dataset_name} has {len(class_names)} classes, but num_classes={self.num_classes}")
        self.class_names = list(class_names)
        self.mean, self.std = channel_stats(train_images, scale)
        aug = build_augmentation(self.crop_padding, self.hflip) if self.augment else None
        make = lambda split, transform=None: ImageTensorDataset(  # noqa: E731
            *splits[split], scale=scale, mean=self.mean, std=self.std, image_size=self.image_size,
            transform=transform, seed=self.seed)
        self.train_dataset, self.val_dataset, self.test_dataset = make("train", aug), make("val"), make("test")

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() first")
        sampler = None
        if train:  # a (seed, epoch) permutation, split between DDP ranks; overfit: epoch 0's batches every epoch
            overfit = self.trainer is not None and bool(self.trainer.overfit_batches)
            sampler = FrozenEpochSampler(dataset) if overfit else shuffled_sampler(dataset, self.seed)
        return EpochDataLoader(dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                               pin_memory=self.pin_memory, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        data = self.train_dataset
        if data is not None and self.repeats_per_epoch > 1:
            data = RepeatedDataset(data, self.repeats_per_epoch)
        return self._resumable(self._loader(data, train=True))

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, train=False)

    # -- helpers for callbacks -------------------------------------------------------------------------------------
    def example_image(self, index: int = 0) -> tuple[Tensor, int]:
        """A fixed validation image, normalized as the model sees it: ``((1, C, H, W), label)``."""
        if self.val_dataset is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() first")
        item = self.val_dataset[index]
        return item["image"][None], int(item["label"])

    def denormalize(self, images: Tensor) -> Tensor:
        """Undo the normalization: (…, C, H, W) back to [0, 1], for display."""
        if self.mean is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() first")
        mean, std = self.mean.view(-1, 1, 1).to(images), self.std.view(-1, 1, 1).to(images)
        return (images * std + mean).clamp(0, 1)
