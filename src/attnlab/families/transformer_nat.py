"""The non-autoregressive transformer translator: ``model=transformer_nat``, served by ``translate.py``."""

from __future__ import annotations

from ..core.value_checks import non_negative_int, table_rules
from . import BLOCK_GROUPS, Family
from .transformer_mt import TINY_NUMBERS, batch_loss

FAMILY = Family(
    name="transformer_nat",
    task="attnlab.tasks.translation_nat.NATTranslationTask",
    net="attnlab.models.transformer_nat.TransformerNAT",
    data="translation",
    groups=BLOCK_GROUPS,
    what="a translation model",
    serves="translate.py",
    description="non-autoregressive transformer translation: a length classifier, every target position in one pass",
    rules=table_rules([("model.net.max_length_offset", non_negative_int)]),
    batch_loss=batch_loss,
    test_overrides=TINY_NUMBERS,
    explorer_input="translation",
)
