"""Translation metrics on detokenized text, reduced across DDP ranks by torchmetrics.

BLEU and chrF are torchmetrics' ports of sacrebleu (``SacreBLEUScore`` with the 13a tokenizer, ``CHRFScore``
with ``n_word_order=0``, i.e. chrF, not chrF++), scaled to 0–100 like sacrebleu; tests check both against the
``sacrebleu`` package itself. Their states are n-gram counts, so corpus-level scores stay exact under DDP.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.text import CHRFScore, SacreBLEUScore


class BucketAccuracy(Metric):
    """Exact-match accuracy per source-length bucket: correct[b] / total[b] (NaN for an empty bucket)."""

    full_state_update = False

    def __init__(self, num_buckets: int):
        super().__init__()
        self.num_buckets = num_buckets
        self.add_state("correct", torch.zeros(num_buckets, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(num_buckets, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, bucket: Tensor, correct: Tensor) -> None:
        """bucket (B,) bucket index of each sentence; correct (B,) bool."""
        bucket = bucket.to(self.total.device)
        self.total += torch.bincount(bucket, minlength=self.num_buckets)
        self.correct += torch.bincount(bucket, weights=correct.to(self.total.device).float(),
                                       minlength=self.num_buckets).long()

    def compute(self) -> Tensor:
        return self.correct.float() / self.total.float()  # 0/0 = NaN: no sentence of that length


class TranslationMetrics(nn.Module):
    """BLEU, chrF, exact match and per-bucket exact match of one stage (val or test)."""

    def __init__(self, num_buckets: int):
        super().__init__()
        self.bleu = SacreBLEUScore(tokenize="13a")
        self.chrf = CHRFScore(n_word_order=0)
        self.exact = MeanMetric()
        self.buckets = BucketAccuracy(num_buckets)

    def update(self, hypotheses: Sequence[str], references: Sequence[str], bucket: Tensor) -> None:
        hyps, refs = list(hypotheses), [[r] for r in references]
        self.bleu.update(hyps, refs)
        self.chrf.update(hyps, refs)
        correct = torch.tensor([h.strip() == r.strip() for h, r in zip(hypotheses, references)])
        self.exact.update(correct.float())
        self.buckets.update(bucket, correct)

    def compute(self, bucket_names: Sequence[str]) -> dict[str, Tensor]:
        out = {"bleu": self.bleu.compute() * 100, "chrf": self.chrf.compute() * 100, "exact_match": self.exact.compute()}
        for name, acc in zip(bucket_names, self.buckets.compute()):
            out[f"exact_match_len_{name}"] = acc
        return out

    def reset(self) -> None:
        for m in (self.bleu, self.chrf, self.exact, self.buckets):
            m.reset()
