"""Guided attention (seed claim C25) and the alignment measures of a TTS model's cross-attention.

Text-to-speech alignments are monotonic and roughly linear: decoder step t of T (mel frames) reads input
character n of N near n/N ≈ t/T. Guided attention (Tachibana et al. 2018, DC-TTS; ESPnet's
``GuidedMultiHeadAttentionLoss``) adds a penalty that is ~0 near that diagonal and → 1 far from it:

    W[t, n] = 1 − exp(−(n/N − t/T)² / (2σ²))        (built per utterance on its true N and T)
    loss    = mean of A ⊙ W over the valid (non-padded) cells of every given head

so an attention that wanders off the diagonal (skipping, repeating, babbling) costs loss from the first step,
long before the mel loss alone would teach the model to align.

Shapes: attention A (B, H, T, N) — decoder steps × input positions; lengths (B,). N counts every position the
attention reads: with the TTS model's ``text_eos`` the characters and the ``<eos>`` after them (ESPnet builds W on
the same N + 1), so callers pass the model's ``text_lengths``, not the batch's.
"""

from __future__ import annotations

import torch
from torch import Tensor


def valid_mask(text_lengths: Tensor, dec_lengths: Tensor, t: int, n: int) -> Tensor:
    """(B, T, N) bool: True where step t < T_b and character n < N_b."""
    steps = torch.arange(t, device=text_lengths.device)[None, :, None] < dec_lengths[:, None, None]
    chars = torch.arange(n, device=text_lengths.device)[None, None, :] < text_lengths[:, None, None]
    return steps & chars


def guided_attention_weights(text_lengths: Tensor, dec_lengths: Tensor, t: int, n: int, sigma: float = 0.4) -> Tensor:
    """(B, T, N) penalty W, 0 on padded cells."""
    dev = text_lengths.device
    tt = torch.arange(t, device=dev, dtype=torch.float32)[None, :, None] / dec_lengths[:, None, None].float()
    nn_ = torch.arange(n, device=dev, dtype=torch.float32)[None, None, :] / text_lengths[:, None, None].float()
    w = 1.0 - torch.exp(-((nn_ - tt) ** 2) / (2 * sigma**2))
    return w * valid_mask(text_lengths, dec_lengths, t, n)


def guided_attention_loss(attention: Tensor | list[Tensor], text_lengths: Tensor, dec_lengths: Tensor,
                          sigma: float = 0.4) -> Tensor:
    """Mean of A ⊙ W over valid cells; ``attention`` (B, H, T, N) or a list of them (layers), heads pooled."""
    maps = attention if isinstance(attention, (list, tuple)) else [attention]
    b, _, t, n = maps[0].shape
    w = guided_attention_weights(text_lengths, dec_lengths, t, n, sigma)[:, None]  # (B, 1, T, N)
    cells = valid_mask(text_lengths, dec_lengths, t, n).sum()
    total = sum((a.float() * w).sum() for a in maps)
    heads = sum(a.shape[1] for a in maps)
    return total / (cells * heads).clamp(min=1)


def focus_rate(attention: Tensor, text_lengths: Tensor, dec_lengths: Tensor) -> Tensor:
    """(B,) mean over valid decoder steps of the largest attention weight (FastSpeech's focus rate), heads
    averaged. 1 = every step attends to one character; 1/N = uniform attention."""
    a = attention.float().mean(dim=1)  # (B, T, N)
    steps = torch.arange(a.shape[1], device=a.device)[None] < dec_lengths[:, None]  # (B, T)
    top = a.max(dim=-1).values * steps
    return top.sum(1) / dec_lengths.clamp(min=1).float()


def diagonal_rate(attention: Tensor, text_lengths: Tensor, dec_lengths: Tensor, band: float = 0.1) -> Tensor:
    """(B,) share of the attention mass within ``band`` of the diagonal, |n/N − t/T| ≤ band, over valid steps,
    heads averaged. A linear alignment scores ~1; uniform attention ~2·band."""
    a = attention.float().mean(dim=1)
    b, t, n = a.shape
    dev = a.device
    tt = torch.arange(t, device=dev, dtype=torch.float32)[None, :, None] / dec_lengths[:, None, None].float()
    nn_ = (torch.arange(n, device=dev, dtype=torch.float32)[None, None, :] + 0.5) / text_lengths[:, None, None].float()
    near = ((nn_ - tt).abs() <= band) & valid_mask(text_lengths, dec_lengths, t, n)
    steps = torch.arange(t, device=dev)[None] < dec_lengths[:, None]
    mass = (a * near).sum(-1)  # (B, T)
    return (mass * steps).sum(1) / dec_lengths.clamp(min=1).float()


def skips_and_repeats(attention: Tensor, text_length: int, dec_length: int, max_jump: int = 3) -> tuple[int, int]:
    """For ONE utterance's (H, T, N) attention (heads averaged): follow the most-attended character per step.

    skipped: characters jumped over when that position moves forward by more than ``max_jump`` at once, plus the
    characters after the last one ever reached (the utterance ended early);
    repeated: steps at which it moves back by more than ``max_jump`` characters (reading a part again).
    """
    a = attention.float().mean(dim=0)[:dec_length, :text_length]  # (T, N)
    if a.numel() == 0:
        return 0, 0
    path = a.argmax(dim=-1).tolist()
    skipped = repeated = 0
    for prev, cur in zip(path, path[1:]):
        if cur - prev > max_jump:
            skipped += cur - prev - 1
        elif prev - cur > max_jump:
            repeated += 1
    skipped += max(0, text_length - 1 - max(path) - max_jump)
    return skipped, repeated
