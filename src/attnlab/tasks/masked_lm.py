"""Masked language modelling (BERT): a share of the tokens is chosen, corrupted, and predicted from both sides.

Of the chosen tokens (``mask_prob``, 15%), 80% become [MASK], 10% a random token and 10% stay as they are
(Devlin et al. 2019): the model cannot tell which unmasked tokens it will be scored on, so it keeps a useful
representation of every position. The loss and the accuracy are over the chosen tokens only. Training draws the
choice from the global generator (a resumed run draws what the uninterrupted one drew: ``Task`` restores it);
validation and test draw it from each batch's own content, so every epoch scores the same positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from ..data.tokenizer import SPECIAL_TOKENS
from .base import Task
from .masking import MaskingSettings
from .protocols import StepOutput
from .text import TextTask


def mask_tokens(ids: Tensor, mask_id: int, mask_prob: float = 0.15, mask_share: float = 0.8,
                random_share: float = 0.1, generator: torch.Generator | None = None,
                random_ids: tuple[int, int] | None = None) -> tuple[Tensor, Tensor]:
    """``(inputs, chosen)``: ``ids`` with the chosen positions corrupted, and the boolean (B, T) choice (at least
    one position). Random replacements are drawn from ``random_ids`` (low, high exclusive; by default attnlab's
    words: after its special tokens, before the [MASK] row)."""
    low, high = random_ids or (len(SPECIAL_TOKENS), mask_id)
    draw = torch.rand((2, *ids.shape), generator=generator, device=ids.device)
    chosen = draw[0] < mask_prob
    if not chosen.any():
        chosen.view(-1)[int(draw[0].argmin())] = True
    inputs = ids.clone()
    inputs[chosen & (draw[1] < mask_share)] = mask_id
    swap = chosen & (draw[1] >= mask_share) & (draw[1] < mask_share + random_share)
    random = torch.randint(low, high, ids.shape, generator=generator, device=ids.device)
    inputs[swap] = random[swap]
    return inputs, chosen


class MaskedLMTask(TextTask, Task):
    """Wraps a :class:`~attnlab.models.masked_lm.MaskedLM` built from ``net`` (a config with ``_target_``); its
    attention maps are drawn over the unmasked validation text (how the encoder reads whole text)."""

    def __init__(self, net, optimizer=None, scheduler=None, compile: bool = False, mask_prob: float = 0.15,
                 mask_share: float = 0.8, random_share: float = 0.1):
        # train.py's check and line (the masked_lm family's rules make the same settings), before the net is built
        MaskingSettings(mask_prob=mask_prob, mask_share=mask_share, random_share=random_share)
        super().__init__(net, optimizer, scheduler, compile)
        self.masking = dict(mask_prob=mask_prob, mask_share=mask_share, random_share=random_share)
        self.val_nll, self.test_nll, self.val_acc, self.test_acc = MeanMetric(), MeanMetric(), MeanMetric(), MeanMetric()

    def forward(self, ids: Tensor) -> Tensor:
        return self._forward(ids)

    def step(self, batch: dict, stage: str) -> StepOutput:
        ids = batch["input_ids"]
        generator = None
        if stage != "train":  # the same positions every epoch
            generator = torch.Generator(ids.device).manual_seed(int(ids.sum()) % 2**62)
        inputs, chosen = mask_tokens(ids, self.net.mask_id, generator=generator,
                                     random_ids=self.net.random_ids, **self.masking)
        logits, target = self(inputs)[chosen], ids[chosen]
        nll = F.cross_entropy(logits, target)
        acc = (logits.argmax(-1) == target).float().mean()
        if stage == "train":
            return StepOutput(nll, {"loss": nll, "acc": acc.detach()})
        nll_metric, acc_metric = getattr(self, f"{stage}_nll"), getattr(self, f"{stage}_acc")
        nll_metric.update(nll, weight=target.numel())
        acc_metric.update(acc, weight=target.numel())
        return StepOutput(nll, {"loss": nll_metric, "acc": acc_metric}, prog_bar=("loss", "acc"))
