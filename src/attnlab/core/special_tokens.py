"""The ids that data and models must agree on, kept below both (docs/layout.md: models never import data).

* BPE vocabularies (:mod:`attnlab.data.tokenizer`) start with four special tokens, in this order, in every
  vocabulary: the models pad, start and stop on these ids.
* The TTS reads characters from a fixed alphabet (:mod:`attnlab.data.characters`), so a checkpoint needs no
  vocabulary file. ``<eos>`` is the last id, so every character's id is the same whether a net uses it or not
  (``text_eos``).
"""

from __future__ import annotations

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))

CHAR_PAD, CHAR_UNK, CHAR_EOS = "<pad>", "<unk>", "<eos>"
ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789'\".,;:!?-()"
CHAR_SYMBOLS: tuple[str, ...] = (CHAR_PAD, CHAR_UNK, *ALPHABET, CHAR_EOS)
CHAR_PAD_ID, CHAR_UNK_ID, CHAR_EOS_ID = 0, 1, len(CHAR_SYMBOLS) - 1  # <eos> = 50


def char_text(ids) -> str:
    """The text of character ids: ``?`` for ``<unk>``, nothing for ``<pad>`` and ``<eos>``."""
    return "".join(CHAR_SYMBOLS[i] if CHAR_UNK_ID < i < CHAR_EOS_ID else ("?" if i == CHAR_UNK_ID else "")
                   for i in ids)
