"""Cross-entropy classification steps shared by the image (ViT) and sequence classifiers: loss, accuracy, MoE terms.

A subclass names its input (``input_key``: ``"image"``, ``"input_ids"``) and adds what is its own (confusion
matrices, accuracy by distance) in :meth:`update_eval_metrics`, which receives each val/test batch's predictions.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from .base import Task
from .protocols import StepOutput


class ClassificationTask(Task):
    """``net(inputs) -> logits (B, num_classes)``; batches are ``{input_key: ..., "label": (B,)}``.

    Args:
        label_smoothing: cross-entropy label smoothing (training loss only; val/test report the plain loss).
    """

    input_key = "input"

    def __init__(self, net, optimizer=None, scheduler=None, compile: bool = False, label_smoothing: float = 0.0):
        super().__init__(net, optimizer, scheduler, compile)
        self.label_smoothing = label_smoothing
        k = self.net.num_classes
        self.val_acc, self.test_acc = MulticlassAccuracy(k, average="micro"), MulticlassAccuracy(k, average="micro")
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()  # per example, reduced over DDP ranks

    def forward(self, inputs: Tensor) -> Tensor:
        return self._forward(inputs)

    def step(self, batch: dict, stage: str) -> StepOutput:
        logits = self(batch[self.input_key])
        if stage == "train":
            ce = F.cross_entropy(logits, batch["label"], label_smoothing=self.label_smoothing)
            acc = (logits.detach().argmax(-1) == batch["label"]).float().mean()
            metrics = {"loss": ce, "acc": acc}
            if self.label_smoothing:  # train/loss is smoothed: the plain one too, as val/loss is
                metrics["nll"] = F.cross_entropy(logits.detach(), batch["label"])
            return StepOutput(ce, metrics)
        loss = F.cross_entropy(logits, batch["label"])
        preds = logits.argmax(dim=-1)
        mean_loss, acc = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_acc")
        mean_loss.update(loss, weight=len(batch["label"]))
        acc.update(preds, batch["label"])
        self.update_eval_metrics(batch, preds, stage)
        return StepOutput(loss, {"loss": mean_loss, "acc": acc}, prog_bar=("loss", "acc"))

    def update_eval_metrics(self, batch: dict, preds: Tensor, stage: str) -> None:
        """A subclass's own val/test metrics of a batch's predicted classes (B,)."""
