"""Characters as the text front-end of the TTS model: a fixed alphabet, so a checkpoint needs no vocabulary file.

Text is lower-cased and its whitespace collapsed (``normalize_text``); any character outside the alphabet becomes
``<unk>``. ``normalize_text`` is the TTS's one text normalization: ``CharVocab.encode`` applies it, so training
(LJSpeech/eSpeak data) and ``synthesize`` read text through the identical function, and a checkpoint needs no
stored normalizer (unlike the BPE tokenizers, see ``normalization.py``).

``<eos>`` (the last id, so the older ids keep their meaning) is never produced by ``encode``: the TTS model appends
it after each text itself when built with ``text_eos`` (ESPnet's convention, see :mod:`attnlab.models.tts`).
"""

from __future__ import annotations

import re

import torch

PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"
ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789'\".,;:!?-()"
SYMBOLS = (PAD, UNK, *ALPHABET, EOS)
EOS_ID = len(SYMBOLS) - 1  # 50: appended last, so checkpoints from before it (50 ids) read the same ids


def normalize_text(text: str) -> str:
    """Lower case, runs of whitespace as one space, ends stripped (idempotent)."""
    return re.sub(r"\s+", " ", text.lower()).strip()


class CharVocab:
    pad_id, unk_id, eos_id = 0, 1, EOS_ID

    def __init__(self):
        self.symbols = SYMBOLS
        self.index = {s: i for i, s in enumerate(SYMBOLS)}

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(c, self.unk_id) for c in normalize_text(text)]

    def decode(self, ids) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return "".join(self.symbols[i] if self.unk_id < i < self.eos_id else ("?" if i == self.unk_id else "")
                       for i in ids)

    def covers(self, text: str) -> bool:
        """True if every character of the normalized text is in the alphabet."""
        return all(c in self.index for c in normalize_text(text))
