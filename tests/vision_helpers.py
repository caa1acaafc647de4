"""Helpers for the image-data tests: tiny CIFAR-10 folders in the real on-disk format."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from attnlab.data.cifar10 import META_FILE, TEST_FILE, TRAIN_FILES

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def write_tiny_cifar(folder: Path, n_per_batch: int = 20, seed: int = 0) -> dict:
    """The real format: pickled dicts with bytes keys, b'data' uint8 (N, 3072) and b'labels' a list of ints.

    Returns ``{file name: (data, labels)}`` of what was written; labels cycle through the 10 classes.
    """
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in (*TRAIN_FILES, TEST_FILE):
        data = rng.integers(0, 256, size=(n_per_batch, 3072), dtype=np.uint8)
        labels = [int(i % 10) for i in range(n_per_batch)]
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [b"x.png"] * n_per_batch}, f)
        written[name] = (data, labels)
    with open(folder / META_FILE, "wb") as f:
        pickle.dump({b"label_names": [c.encode() for c in CLASSES], b"num_cases_per_batch": n_per_batch,
                     b"num_vis": 3072}, f)
    return written
