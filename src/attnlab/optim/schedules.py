"""Learning-rate schedules: the multiplier of the base learning rate at optimizer step ``step`` (0-based) of a run
of ``total_steps`` optimizer steps, for ``torch.optim.lr_scheduler.LambdaLR`` (:func:`attnlab.optim.build_lr_schedule`
passes both; the rest comes from conf/sched). Every schedule warms up linearly from 0 to 1 over ``warmup_steps``."""

from __future__ import annotations

import math


def _warmup(step: int, warmup_steps: int) -> float | None:
    """The warm-up multiplier, or None once warm-up is over."""
    return (step + 1) / warmup_steps if warmup_steps > 0 and step < warmup_steps else None


def _progress(step: int, start: int, total_steps: int) -> float:
    """How far ``step`` is through the steps from ``start`` to ``total_steps``, clamped to [0, 1]."""
    return min(1.0, max(0.0, (step - start) / max(1, total_steps - start)))


def warmup_cosine(step: int, total_steps: int, *, warmup_steps: int = 0, min_lr_ratio: float = 0.0) -> float:
    """Warm-up, then a half cosine from 1 down to ``min_lr_ratio`` at ``total_steps`` (GPT-3, nanoGPT)."""
    if (w := _warmup(step, warmup_steps)) is not None:
        return w
    progress = _progress(step, warmup_steps, total_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_stable_decay(step: int, total_steps: int, *, warmup_steps: int = 0, min_lr_ratio: float = 0.0,
                        decay_fraction: float = 0.2) -> float:
    """Warm-up, 1 until the last ``decay_fraction`` of the run, then linear down to ``min_lr_ratio`` (WSD, MiniCPM;
    the constant stretch lets a run be continued or cut with only a short decay)."""
    if (w := _warmup(step, warmup_steps)) is not None:
        return w
    decay_start = max(warmup_steps, total_steps - round(decay_fraction * total_steps))
    return 1 - (1 - min_lr_ratio) * _progress(step, decay_start, total_steps)


def warmup_linear(step: int, total_steps: int, *, warmup_steps: int = 0, min_lr_ratio: float = 0.0) -> float:
    """Warm-up, then linear from 1 down to ``min_lr_ratio`` at ``total_steps`` (BERT, the T5 fine-tuning recipe)."""
    if (w := _warmup(step, warmup_steps)) is not None:
        return w
    return 1 - (1 - min_lr_ratio) * _progress(step, warmup_steps, total_steps)


def warmup_constant(step: int, total_steps: int, *, warmup_steps: int = 0) -> float:
    """Warm-up, then the base learning rate to the end (the same at any ``total_steps``)."""
    w = _warmup(step, warmup_steps)
    return 1.0 if w is None else w
