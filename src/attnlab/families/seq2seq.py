"""The RNN encoder-decoder for translation, with or without attention: ``model=seq2seq_attention`` and its preset
``model=seq2seq_baseline`` (the fixed context vector), served by ``translate.py``."""

from __future__ import annotations

from typing import Any

from ..core.choices import RNN_ATTENTIONS as ATTENTIONS, RNN_CELLS as CELLS
from ..core.value_checks import one_of, positive_int, table_rules
from . import Family
from .transformer_mt import TINY_NUMBERS


def _even_hidden(flat: dict[str, Any]) -> str | None:
    d = flat.get("model.net.d_hidden")
    if isinstance(d, int) and d % 2:
        return f"model.net.d_hidden={d} must be even (the bidirectional encoder runs d_hidden/2 per direction)"
    return None


def batch_loss(net, gen):
    import torch
    import torch.nn.functional as F

    src = torch.randint(4, net.vocab_size, (4, 7), generator=gen)
    tgt = torch.randint(4, net.vocab_size, (4, 9), generator=gen)
    scores = net(src, torch.ones_like(src, dtype=torch.bool), tgt[:, :-1])
    return F.cross_entropy(scores.flatten(0, 1), tgt[:, 1:].flatten())  # log-probs or logits alike


FAMILY = Family(
    name="seq2seq_attention",
    models=("seq2seq_attention", "seq2seq_baseline"),
    task="attnlab.tasks.translation.TranslationTask",
    net="attnlab.models.seq2seq_rnn.Seq2SeqRNN",
    data="translation",
    groups=(),
    what="a translation model",
    serves="translate.py",
    description="RNN encoder-decoder with Bahdanau/Luong attention; seq2seq_baseline: one fixed context vector",
    # the command-line shortcuts copied into model.net (model.cell=lstm, model.attention=none)
    rules=table_rules([("model.cell", one_of(CELLS)), ("model.attention", one_of(ATTENTIONS)),
                       *((f"model.net.{k}", positive_int) for k in ("d_emb", "d_hidden"))], [_even_hidden]),
    batch_loss=batch_loss,
    test_overrides=TINY_NUMBERS,
    explorer_input="translation",
)
