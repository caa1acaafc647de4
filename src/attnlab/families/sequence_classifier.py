"""Sequence classification by attention, a GRU or a CNN (claim E7): ``model=sequence_classifier``, served by
``train.py ckpt_path=... train=false``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.choices import ENCODERS
from ..core.value_checks import one_of, positive_int, table_rules
from . import BLOCK_GROUPS, Family


def encoder_groups(net_cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """Only the attention encoder is built from the block groups (train.py refuses them for rnn and cnn)."""
    return BLOCK_GROUPS if net_cfg.get("encoder", "attention") == "attention" else ()


def _bidirectional_gru(flat: Mapping[str, Any]) -> str | None:
    d = flat.get("model.net.d_model")
    if flat.get("model.net.bidirectional") and flat.get("model.net.encoder") == "rnn" and isinstance(d, int) and d % 2:
        return f"model.net.d_model={d} must be even for a bidirectional GRU (d_model/2 per direction)"
    return None


def batch_loss(net, gen):
    import torch
    import torch.nn.functional as F

    ids = torch.randint(1, net.vocab_size, (4, 10), generator=gen)
    return F.cross_entropy(net(ids), torch.arange(4) % net.num_classes)


FAMILY = Family(
    name="sequence_classifier",
    task="attnlab.tasks.sequence_classification.SequenceClassificationTask",
    net="attnlab.models.sequence_classifier.SequenceClassifier",
    data="sequences",
    groups=BLOCK_GROUPS,
    narrow_groups=encoder_groups,
    what="a sequence classifier",
    serves="train.py ckpt_path=... train=false",
    description="sequence classification by attention, a GRU or a CNN (model.encoder), needle recall by default",
    rules=table_rules([("model.encoder", one_of(ENCODERS)), ("model.net.kernel_size", positive_int)],
                      [_bidirectional_gru]),
    batch_loss=batch_loss,
    test_overrides=("data.train_size=256", "data.val_size=32", "data.test_size=32"),
    explorer_input="ids",
)
