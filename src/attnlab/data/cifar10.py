"""CIFAR-10 from the standard python batches (``cifar-10-batches-py/``), read without torchvision.

The files are found, read and (only with ``download=True``: the official archive, checked against its MD5)
downloaded by :mod:`attnlab.data.cifar10_files`, which imports no torch. A validation split (``val_fraction`` of the
training batches, per class) is held out with ``seed``. Augmentation (train only): random crop with
``crop_padding`` pixels of zero padding, random horizontal flip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .cifar10_files import (  # noqa: F401 - the file functions' old home: callers import them from here too
    CIFAR10_MD5,
    CIFAR10_URL,
    IMAGE_SHAPE,
    META_FILE,
    TEST_FILE,
    TRAIN_FILES,
    _require_file,
    download_cifar10,
    load_cifar10,
    read_batch,
    read_meta,
)
from .images import ImageClassificationDataModule, stratified_split
from ..core.errors import ConfigError


class CIFAR10DataModule(ImageClassificationDataModule):
    dataset_name = "CIFAR-10"

    def __init__(
        self,
        path: str,
        download: bool = False,
        image_size: int = 32,
        in_channels: int = 3,
        num_classes: int = 10,
        batch_size: int = 128,
        num_workers: int = 0,
        augment: bool = True,
        crop_padding: int = 4,
        hflip: bool = True,
        val_fraction: float = 0.1,
        seed: int = 0,
        pin_memory: bool = False,
        repeats_per_epoch: int = 1,
    ):
        if not 0 < val_fraction < 1:
            raise ConfigError(f"val_fraction must be in (0, 1), got {val_fraction}")
        super().__init__(image_size, in_channels, num_classes, batch_size, num_workers, augment, crop_padding,
                         hflip, seed, pin_memory, repeats_per_epoch)
        self.path, self.download, self.val_fraction = Path(path).expanduser(), download, val_fraction
        self.save_hyperparameters()

    def prepare_data(self) -> None:
        """Download (rank 0 only, and only with ``download=True``)."""
        if self.download:
            download_cifar10(self.path)

    def load_splits(self):
        data = load_cifar10(self.path)
        images, labels = data["train"]
        train_idx, val_idx = stratified_split(labels, (1 - self.val_fraction, self.val_fraction), self.seed)
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
        splits = {
            "train": (t(images[train_idx]), t(labels[train_idx])),
            "val": (t(images[val_idx]), t(labels[val_idx])),
            "test": (t(data["test"][0]), t(data["test"][1])),
        }
        return splits, 1.0 / 255.0, data["class_names"]
