"""Causal language modelling task: next-token cross-entropy, perplexity, sampling for inspection."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MeanMetric

from ..decoding import CausalLMStepper, SamplingOptions, generate
from ..modules.loss import linear_cross_entropy
from .base import Task
from .protocols import StepOutput
from .text import TextTask


def lm_loss(net, ids: Tensor, labels: Tensor) -> Tensor:
    """Mean next-token cross-entropy of a :class:`CausalLM`, fused with its (bias-free) head when it has one.

    The fused form never holds the (B·T, V) logits (see :mod:`attnlab.modules.loss`); any other net is called
    for its logits and scored with ``F.cross_entropy``.
    """
    head = getattr(net, "head", None)
    if callable(getattr(net, "hidden_states", None)) and head is not None and head.bias is None:
        return linear_cross_entropy(net.hidden_states(ids), head.weight, labels)
    return F.cross_entropy(net(ids).flatten(0, 1), labels.flatten())


class CausalLMTask(TextTask, Task):
    """Wraps a :class:`~attnlab.models.causal_lm.CausalLM` built from ``net`` (a config with ``_target_``)."""

    def __init__(self, net, optimizer=None, scheduler=None, compile: bool = False):
        super().__init__(net, optimizer, scheduler, compile)
        # Mean token-level NLL over the epoch; exp of it is the corpus perplexity. (torchmetrics' Perplexity
        # would recompute log-softmax over B·T·V logits a second time; the loss already holds that number.)
        self.val_nll, self.test_nll = MeanMetric(), MeanMetric()

    def forward(self, ids: Tensor) -> Tensor:
        return self._forward(ids)

    def _nll(self, batch: dict) -> Tensor:
        if self._compiled is None:  # eager: the fused head + loss (no (B·T, V) logits kept)
            return lm_loss(self.net, batch["input_ids"], batch["labels"])
        logits = self(batch["input_ids"])  # compiled: let the compiler see the whole graph
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def step(self, batch: dict, stage: str) -> StepOutput:
        nll = self._nll(batch)
        if stage == "train":
            return StepOutput(nll, {"loss": nll, "ppl": torch.exp(nll.detach())})
        metric = getattr(self, f"{stage}_nll")
        metric.update(nll, weight=batch["labels"].numel())
        return StepOutput(nll, {"loss": metric})

    def on_validation_epoch_end(self) -> None:
        # the metric is already reduced over ranks; sync_dist only silences Lightning's warning
        self.log("val/ppl", torch.exp(self.val_nll.compute()), prog_bar=True, sync_dist=True)

    def on_test_epoch_end(self) -> None:
        self.log("test/ppl", torch.exp(self.test_nll.compute()), sync_dist=True)

    @torch.no_grad()
    def sample(self, prefix: Tensor, options: SamplingOptions | Mapping, use_cache: bool = True, *,
               generator: torch.Generator | None = None, vocab_size: int | None = None) -> Tensor:
        """prefix (B, T) -> (B, T + at most ``options.max_new_tokens``), sampled with the options' temperature, top-k
        and top-p (``options``: a :class:`SamplingOptions`, or the fields of one for a caller below the decoding
        layer, such as :func:`attnlab.probes.language_model.greedy`)."""
        options = options if isinstance(options, SamplingOptions) else SamplingOptions(**options)
        was_training = self.net.training
        self.net.eval()
        try:
            return generate(CausalLMStepper(self.net, use_cache), prefix, options, generator=generator,
                            vocab_size=vocab_size)
        finally:
            self.net.train(was_training)
