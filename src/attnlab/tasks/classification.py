"""Cross-entropy classification steps shared by the image (ViT) and sequence classifiers: loss, accuracy, MoE terms.

A subclass names its input (``input_key``: ``"image"``, ``"input_ids"``) and adds what is its own (confusion
matrices, accuracy by distance) by extending :meth:`_eval_step`, which returns the predictions.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from .base import Task


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

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        logits = self(batch[self.input_key])
        ce = F.cross_entropy(logits, batch["label"], label_smoothing=self.label_smoothing)
        self.log("train/loss", ce, on_step=True, prog_bar=True)
        self.log("train/acc", (logits.detach().argmax(-1) == batch["label"]).float().mean(), on_step=True)
        return self.add_moe_losses(ce, "train")

    def _eval_step(self, batch: dict, stage: str) -> Tensor:
        """Loss and accuracy of a val/test batch, logged per epoch; returns the predicted classes (B,)."""
        logits = self(batch[self.input_key])
        loss = F.cross_entropy(logits, batch["label"])
        self.add_moe_losses(loss, stage)
        preds = logits.argmax(dim=-1)
        mean_loss, acc = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_acc")
        mean_loss.update(loss, weight=len(batch["label"]))
        acc.update(preds, batch["label"])
        self.log(f"{stage}/loss", mean_loss, on_epoch=True, prog_bar=True)
        self.log(f"{stage}/acc", acc, on_epoch=True, prog_bar=True)
        return preds

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch, "test")
