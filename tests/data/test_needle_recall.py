"""Needle recall data (claim E7): the label is the one needle symbol, at the distance from the query it claims."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.needle_recall import NeedleRecallDataModule, needle_recall


def test_labels_needles_and_distances_are_what_they_claim():
    g = torch.Generator().manual_seed(0)
    ids, labels, dist = needle_recall(600, seq_len=16, num_classes=4, num_fillers=3, generator=g)
    query = 4 + 3
    assert ids.shape == (600, 16) and labels.shape == dist.shape == (600,)
    assert (ids[:, -1] == query).all() and ((ids == query).sum(1) == 1).all()
    needle = ids < 4
    assert (needle.sum(1) == 1).all()  # exactly one needle; the rest are fillers 4..6 and the query
    assert ((ids[:, :-1] >= 4) & (ids[:, :-1] < 7)).sum(1).eq(14).all()
    p = needle.int().argmax(1)
    assert torch.equal(labels, ids[torch.arange(600), p])
    assert torch.equal(dist, 16 - 1 - p)  # needle position to query position
    assert dist.min() == 1 and dist.max() == 15  # every distance 1 … T-1 occurs
    assert labels.bincount(minlength=4).min() > 100  # the classes are balanced


def test_distance_range_and_bad_arguments():
    _, _, dist = needle_recall(200, 32, 8, 8, torch.Generator().manual_seed(1), min_distance=20, max_distance=25)
    assert dist.min() >= 20 and dist.max() <= 25
    with pytest.raises(ValueError, match="max_distance <= seq_len - 1 = 31"):
        needle_recall(1, 32, 8, 8, max_distance=32)
    with pytest.raises(ValueError, match="vocab_size=16 < num_classes \\+ num_fillers \\+ 1 = 17"):
        NeedleRecallDataModule(num_classes=8, num_fillers=8, vocab_size=16)


def test_datamodule_splits_are_deterministic_and_distinct():
    kw = dict(seq_len=12, num_classes=3, num_fillers=2, vocab_size=6, train_size=64, val_size=16, test_size=32, seed=3)
    dm = NeedleRecallDataModule(batch_size=8, **kw)
    dm.setup()
    batch = next(iter(dm.test_dataloader()))
    assert set(batch) == {"input_ids", "label", "distance"} and batch["input_ids"].shape == (8, 12)
    again = NeedleRecallDataModule(**kw)
    again.setup()
    assert torch.equal(dm.datasets["val"].ids, again.datasets["val"].ids)
    assert not torch.equal(dm.datasets["val"].ids, dm.datasets["train"].ids[:16])
    example = dm.example()
    assert example["input_ids"].shape == (1, 12)
    names = dm.token_names(example["input_ids"][0])
    assert names[-1] == "?" and names.count("·") == 10
    assert names[11 - int(example["distance"])] == str(int(example["label"]))
