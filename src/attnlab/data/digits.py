"""UCI handwritten digits, as bundled with scikit-learn (``sklearn.datasets.load_digits``: no download).

1,797 grey 8×8 images of the digits 0–9, pixel values 0..16 (scaled to [0, 1] here), split per class into
train/val/test (70/15/15 by default) with a fixed seed. ``image_size`` > 8 upsamples (bilinear), e.g. 16 = 2×.
Augmentation (train only, optional): a random shift of up to ``crop_padding`` pixels (default 0: at the default
budget one pixel of shift cost accuracy, 83% vs 97% test accuracy after 40 passes); no flips (a flipped digit is
another symbol).
"""

from __future__ import annotations

import torch

from .images import ImageClassificationDataModule, stratified_split
from ..core.errors import ConfigError

DIGITS_SIZE = 8


def load_digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """images uint8 (1797, 1, 8, 8) with values 0..16, labels long (1797,)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = torch.from_numpy(d.images.astype("uint8")).unsqueeze(1)
    return images, torch.from_numpy(d.target).long()


class DigitsDataModule(ImageClassificationDataModule):
    dataset_name = "digits"

    def __init__(
        self,
        image_size: int = 8,
        in_channels: int = 1,
        num_classes: int = 10,
        batch_size: int = 64,
        num_workers: int = 0,
        augment: bool = True,
        crop_padding: int = 0,
        hflip: bool = False,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        seed: int = 0,
        pin_memory: bool = False,
        repeats_per_epoch: int = 1,
    ):
        if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ConfigError(f"val_fraction={val_fraction} and test_fraction={test_fraction} must be in (0, 1) and "
                             "sum to < 1")
        super().__init__(image_size, in_channels, num_classes, batch_size, num_workers, augment, crop_padding,
                         hflip, seed, pin_memory, repeats_per_epoch)
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.save_hyperparameters()

    def split_indices(self, labels: torch.Tensor):
        """(train, val, test) index arrays: stratified, disjoint, deterministic for ``seed``."""
        train_fraction = 1.0 - self.val_fraction - self.test_fraction
        return stratified_split(labels.numpy(), (train_fraction, self.val_fraction, self.test_fraction), self.seed)

    def load_splits(self):
        images, labels = load_digits_arrays()
        parts = self.split_indices(labels)
        splits = {name: (images[torch.from_numpy(idx)], labels[torch.from_numpy(idx)])
                  for name, idx in zip(("train", "val", "test"), parts)}
        return splits, 1.0 / 16.0, [str(i) for i in range(10)]
