"""Scheduled sampling: Bengio et al.'s schedules, and the two-pass input mixing of the transformer."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.decoding.scheduled_sampling import SamplingSchedule, mix_predictions


def test_schedules_follow_their_formulas_and_decay():
    assert SamplingSchedule("none").sampling_ratio(10**6) == 0.0
    assert SamplingSchedule("constant", ratio=0.25).sampling_ratio(0) == 0.25
    lin = SamplingSchedule("linear", c=1e-3, min_teacher=0.2)
    assert lin.teacher_prob(0) == 1.0 and lin.teacher_prob(500) == pytest.approx(0.5) and lin.teacher_prob(10**5) == 0.2
    exp = SamplingSchedule("exponential", k=0.99)
    assert exp.teacher_prob(100) == pytest.approx(0.99**100)
    inv = SamplingSchedule("inverse_sigmoid", k=100)
    assert inv.teacher_prob(0) == pytest.approx(100 / 101) and inv.teacher_prob(500) == pytest.approx(100 / (100 + math.exp(5)))
    assert inv.teacher_prob(10**9) < 1e-300  # no overflow far out
    for s in (lin, exp, inv):
        ratios = [s.sampling_ratio(i) for i in range(0, 5000, 250)]
        assert ratios == sorted(ratios) and ratios[-1] > ratios[0]


@pytest.mark.parametrize("bad", [dict(schedule="cosine"), dict(schedule="exponential", k=1.5),
                                 dict(schedule="inverse_sigmoid", k=0.5), dict(schedule="constant", ratio=2.0)])
def test_bad_schedule_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingSchedule(**bad)


def test_mix_predictions_ratio_zero_is_teacher_forcing_and_one_feeds_the_shifted_argmax():
    tgt_in = torch.tensor([[1, 5, 6, 7], [1, 8, 0, 0]])
    mask = tgt_in != 0
    scores = torch.zeros(2, 4, 10)
    pred = torch.tensor([[9, 9, 4, 3], [3, 2, 2, 2]])
    scores.scatter_(2, pred[..., None], 1.0)
    assert mix_predictions(tgt_in, scores, 0.0, mask) is tgt_in
    mixed = mix_predictions(tgt_in, scores, 1.0, mask)
    # position t takes the prediction made at t-1; <bos> and padding stay
    assert mixed.tolist() == [[1, 9, 9, 4], [1, 3, 0, 0]]
    g = torch.Generator().manual_seed(0)
    big = torch.randint(3, 10, (64, 50))
    half = mix_predictions(big, torch.randn(64, 50, 10), 0.5, generator=g)
    frac = (half[:, 1:] != big[:, 1:]).float().mean().item()
    assert 0.35 < frac < 0.55  # about half swapped (minus predictions that happen to equal the reference)
