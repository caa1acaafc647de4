"""Scheduled sampling (seed claim C23; Bengio et al. 2015; Mihaylova & Martins 2019 for transformers).

Teacher forcing feeds the decoder the reference's previous token; at inference it sees its own. Scheduled sampling
closes that gap gradually: at training step i the reference token is used with probability ε_i and the model's
own prediction otherwise (the *sampling ratio* is 1 − ε_i). Bengio et al.'s decays of ε_i:

    linear           ε_i = max(ε_min, 1 − c·i)
    exponential      ε_i = max(ε_min, k^i)            (k < 1)
    inverse_sigmoid  ε_i = max(ε_min, k / (k + exp(i / k)))   (k ≥ 1)
    constant         ε_i = 1 − ratio                  (a fixed mix, for sweeps)
    none             ε_i = 1                          (plain teacher forcing)

How the model's own tokens are obtained depends on the decoder. An RNN decodes step by step anyway, so it swaps
tokens inside its loop (``per_step_sampling``). A transformer decodes all positions at once, so it uses two
passes: a first pass without gradient under teacher forcing gives the predictions, each input position t ≥ 1 then
takes the prediction made at t − 1 with probability 1 − ε, and the loss comes from a second pass on those mixed
inputs (:func:`mix_predictions`; the argmax variant of Mihaylova & Martins).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.choices import SCHEDULES



@dataclass(frozen=True)
class SamplingSchedule:
    schedule: str = "none"
    k: float = 0.999  # exponential: ε = k^i; inverse_sigmoid: ε = k / (k + exp(i/k)) (e.g. k = 500)
    c: float = 1e-4  # linear slope per step
    min_teacher: float = 0.0  # ε_min: the floor of the teacher-forcing probability
    ratio: float = 0.0  # constant: the sampling ratio itself

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown scheduled sampling schedule {self.schedule!r}; valid: {', '.join(SCHEDULES)}")
        if not 0.0 <= self.min_teacher <= 1.0 or not 0.0 <= self.ratio <= 1.0:
            raise ValueError("min_teacher and ratio must lie in [0, 1]")
        if self.schedule == "exponential" and not 0.0 < self.k < 1.0:
            raise ValueError(f"the exponential schedule needs 0 < k < 1, got k={self.k}")
        if self.schedule == "inverse_sigmoid" and self.k < 1.0:
            raise ValueError(f"the inverse_sigmoid schedule needs k >= 1, got k={self.k}")

    def teacher_prob(self, step: int) -> float:
        """ε_i: the probability of feeding the reference token at training step ``step``."""
        s = self.schedule
        if s == "none":
            return 1.0
        if s == "constant":
            return 1.0 - self.ratio
        if s == "linear":
            eps = 1.0 - self.c * step
        elif s == "exponential":
            eps = self.k**step
        else:  # inverse_sigmoid; exp overflows past ~700, where ε is 0 anyway
            eps = self.k / (self.k + math.exp(min(step / self.k, 700.0)))
        return max(self.min_teacher, eps)

    def sampling_ratio(self, step: int) -> float:
        return 1.0 - self.teacher_prob(step)


def mix_predictions(tgt_in: Tensor, scores: Tensor, ratio: float, tgt_mask: Tensor | None = None,
                    generator: torch.Generator | None = None) -> Tensor:
    """The second pass's decoder input: ``tgt_in`` (B, T) where each position t ≥ 1 takes, with probability
    ``ratio``, the first pass's prediction for it, ``scores[:, t - 1].argmax()`` (scores (B, T, V)).

    Position 0 (<bos>) and padding (``tgt_mask`` False) are never replaced. ``ratio`` 0 returns ``tgt_in`` itself.
    """
    if ratio <= 0.0:
        return tgt_in
    pred = scores.argmax(dim=-1)  # (B, T): the token predicted *after* each position
    swap = torch.rand(tgt_in.shape, device=tgt_in.device, generator=generator) < ratio
    swap[:, 0] = False
    if tgt_mask is not None:
        swap &= tgt_mask
    shifted = torch.cat([tgt_in[:, :1], pred[:, :-1]], dim=1)  # shifted[:, t] = prediction made at t - 1
    return torch.where(swap, shifted, tgt_in)
