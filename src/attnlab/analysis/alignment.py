"""How often cross-attention points at the right source words (claim E2: alignment learned with no supervision).

For the number-words data the right source words are known at the level of magnitude groups
(:func:`attnlab.data.numbers.word_chunks`: millions / thousands / hundreds / rest), so each target token has a
*chunk*, each source token too, and an attention row (the weights used to produce one target token) is counted as
aligned when its argmax lands on a source token of the target token's chunk; the softer score is the share of the
row's weight on those tokens (over the real source tokens, <eos> included). Two references put the rate in scale:

* chance: a uniformly random source position (the share of same-chunk tokens among the real source tokens);
* diagonal: the monotonic guess "target word i of T reads source word ≈ (i + ½)·S/T" (the chunks come in the same
  order on both sides, so position alone already aligns a good share; attention has to beat this to show more
  than "read left to right").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from ..data.numbers import word_chunks
from ..data.tokenizer import BPETokenizer

NO_CHUNK = -1  # <eos> and anything outside the text's words


def token_chunks(tokenizer: BPETokenizer, text: str, lang: str) -> list[int]:
    """The chunk of every token of ``tokenizer.encode(text)`` (one per token, in order).

    A token belongs to the word holding its last character (its span may start with the space before the word);
    the pieces of a hyphenated word ("thirty", "-", "four") share the word's chunk."""
    words = word_chunks(text, lang)
    word_of_char = [NO_CHUNK] * len(text)
    for w, m in enumerate(re.finditer(r"\S+", text)):
        word_of_char[m.start() : m.end()] = [w] * (m.end() - m.start())
    out = []
    for start, end in tokenizer.offsets(text):
        w = word_of_char[end - 1] if end > start else NO_CHUNK
        out.append(words[w] if w != NO_CHUNK else NO_CHUNK)
    return out


@dataclass
class AlignmentCounts:
    """Sums over target tokens; the rates are these divided by ``total``."""

    hits: float = 0.0  # argmax attention on a source token of the target token's chunk
    mass: float = 0.0  # attention weight on the source tokens of the target token's chunk (a softer score)
    on_eos: float = 0.0  # argmax on a source token without a chunk (<eos>)
    chance: float = 0.0  # expected hits of a uniformly random source position
    diagonal: float = 0.0  # hits of the monotonic position guess
    total: int = 0  # target tokens scored (those with a chunk)

    def add(self, other: "AlignmentCounts") -> None:
        self.hits += other.hits
        self.mass += other.mass
        self.on_eos += other.on_eos
        self.chance += other.chance
        self.diagonal += other.diagonal
        self.total += other.total

    def rates(self) -> dict[str, float]:
        n = max(self.total, 1)
        return {"argmax": self.hits / n, "mass": self.mass / n, "on_eos": self.on_eos / n,
                "chance": self.chance / n, "diagonal": self.diagonal / n}


def alignment_counts(attn: Tensor, src_chunks: list[int], tgt_chunks: list[int]) -> AlignmentCounts:
    """Score one pair.

    Args:
        attn: (T, S) attention weights, row t = the weights used to predict target token t (padding columns and
            rows beyond the lists are ignored).
        src_chunks: chunk of each real source token (``NO_CHUNK`` for <eos>): the first ``len(src_chunks)``
            columns.
        tgt_chunks: chunk of each target token predicted (``NO_CHUNK`` rows, e.g. <eos>, are not scored).
    """
    S, T = len(src_chunks), len(tgt_chunks)
    if attn.shape[0] < T or attn.shape[1] < S:
        raise ValueError(f"attention {tuple(attn.shape)} is smaller than the {T} target x {S} source tokens")
    # the diagonal guess maps the scored target tokens evenly onto the source tokens that have a chunk (not <eos>)
    words = [s for s in range(S) if src_chunks[s] != NO_CHUNK]
    scored = [t for t in range(T) if tgt_chunks[t] != NO_CHUNK]
    weights = attn[:T, :S].float()
    argmax = weights.argmax(dim=-1).tolist()
    src = torch.tensor(src_chunks)
    counts = AlignmentCounts()
    for i, t in enumerate(scored):
        chunk = tgt_chunks[t]
        counts.total += 1
        counts.hits += src_chunks[argmax[t]] == chunk
        counts.on_eos += src_chunks[argmax[t]] == NO_CHUNK
        counts.mass += float(weights[t][src == chunk].sum() / weights[t].sum().clamp_min(1e-12))
        counts.chance += sum(c == chunk for c in src_chunks) / S
        if words:
            guess = words[min(len(words) - 1, int((i + 0.5) * len(words) / len(scored)))]
            counts.diagonal += src_chunks[guess] == chunk
    return counts
