"""The transformer encoder-decoder for translation: ``model=transformer_mt``, served by ``translate.py``."""

from __future__ import annotations

from . import BLOCK_GROUPS, Family

# tiny number-word data sets: a run of a few seconds
TINY_NUMBERS = ("data.train_size=300", "data.val_size=24", "data.test_size=24", "data.max_digits=4")


def batch_loss(net, gen):
    import torch
    import torch.nn.functional as F

    src = torch.randint(4, net.vocab_size, (4, 7), generator=gen)
    tgt = torch.randint(4, net.vocab_size, (4, 9), generator=gen)
    scores = net(src, torch.ones_like(src, dtype=torch.bool), tgt[:, :-1])
    return F.cross_entropy(scores.flatten(0, 1), tgt[:, 1:].flatten())


FAMILY = Family(
    name="transformer_mt",
    task="attnlab.tasks.translation.TranslationTask",
    net="attnlab.models.transformer_mt.TransformerMT",
    data="translation",
    groups=BLOCK_GROUPS,
    what="a translation model",
    serves="translate.py",
    description="transformer encoder-decoder translating English number words into French (the default job)",
    batch_loss=batch_loss,
    test_overrides=TINY_NUMBERS,
    explorer_input="translation",
)
