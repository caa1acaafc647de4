"""Characters as the text front-end of the TTS model: a fixed alphabet, so a checkpoint needs no vocabulary file.

Text is lower-cased and its whitespace collapsed (``normalize_text``); any character outside the alphabet becomes
``<unk>``. ``normalize_text`` is the TTS's one text normalization: ``CharVocab.encode`` applies it, so training
(LJSpeech/eSpeak data) and ``synthesize`` read text through the identical function, and a checkpoint needs no
stored normalizer (unlike the BPE tokenizers, see ``normalization.py``).

The alphabet and its ids are in :mod:`attnlab.core.special_tokens` (the model reads them too). ``<eos>`` is never
produced by ``encode``: the TTS model appends it after each text itself when built with ``text_eos`` (ESPnet's
convention, see :mod:`attnlab.models.tts`).
"""

from __future__ import annotations

import re

from ..core.special_tokens import CHAR_EOS_ID, CHAR_PAD_ID, CHAR_SYMBOLS, CHAR_UNK_ID, char_text


def normalize_text(text: str) -> str:
    """Lower case, runs of whitespace as one space, ends stripped (idempotent)."""
    return re.sub(r"\s+", " ", text.lower()).strip()


class CharVocab:
    pad_id, unk_id, eos_id = CHAR_PAD_ID, CHAR_UNK_ID, CHAR_EOS_ID

    def __init__(self):
        self.symbols = CHAR_SYMBOLS
        self.index = {s: i for i, s in enumerate(CHAR_SYMBOLS)}

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(c, self.unk_id) for c in normalize_text(text)]

    def decode(self, ids) -> str:
        return char_text(ids.tolist() if hasattr(ids, "tolist") else ids)  # a tensor or an array: its ints

    def covers(self, text: str) -> bool:
        """True if every character of the normalized text is in the alphabet."""
        return all(c in self.index for c in normalize_text(text))
