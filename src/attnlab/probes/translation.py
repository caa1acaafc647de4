"""Decoding a translation model's test split side by side in one process (same machine state, same batches), which
the logged test metrics of separate runs cannot give (used by claims E4, E13, E15, E17; any ``TranslationTask``).

    batches = test_batches(dm, limit=None)       # the test split in the data module's own (length-sorted) batches
    out = decode(task, batches, beam_size=5)     # hypotheses, references, log-probs, seconds, sentences/s
    bleu, em = score(out.hyps, out.refs)         # sacrebleu's BLEU (via torchmetrics) and exact match
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ..metrics.translation import TranslationMetrics


def test_batches(dm, split: str = "test", limit: int | None = None) -> list[dict]:
    """The split's batches as the test saw them (length-sorted, in order). ``limit``: about that many sentences,
    every k-th batch, so short and long sources are both kept (a --quick analysis stays short)."""
    loader = dm.copy_test_dataloader() if split == "copy_test" else dm.test_dataloader()
    if isinstance(loader, list):
        loader = loader[0]
    batches = list(loader)
    if limit is not None:
        per = max(1, len(batches[0]["src"]))
        want = max(1, -(-limit // per))
        step = max(1, len(batches) // want)
        batches = batches[::step][:want]
    return batches


@dataclass
class Decoded:
    hyps: list[str]
    refs: list[str]
    srcs: list[str]
    logprobs: Tensor  # (N,) summed log-prob of each best hypothesis
    scores: Tensor  # (N,) the search's own (length-normalized) score of it
    seconds: float  # decoding time, summed over batches (encoder included, no data loading)

    @property
    def sentences_per_sec(self) -> float:
        return len(self.hyps) / self.seconds if self.seconds > 0 else float("nan")


@torch.no_grad()
def decode(task, batches: list[dict], repeats: int = 1, **decoding) -> Decoded:
    """Translate every batch with ``task.translate_batch`` and the :class:`~attnlab.decoding.options.DecodingOptions`
    ``decoding`` names; the time is the fastest of ``repeats`` passes (a shared machine's noise only ever adds
    time)."""
    from ..decoding import DecodingOptions
    from ..tasks.translation import decode_text

    options = DecodingOptions(**decoding)

    best_time = float("inf")
    for _ in range(repeats):
        hyps, refs, srcs, logprobs, scores, seconds = [], [], [], [], [], 0.0
        for batch in batches:
            start = time.perf_counter()
            result = task.translate_batch(batch["src"], batch["src_mask"], options)
            seconds += time.perf_counter() - start
            hyps += [decode_text(task.tokenizer, ids) for ids in result.best]
            refs += list(batch["tgt_text"])
            srcs += list(batch["src_text"])
            logprobs.append(result.logprobs[:, 0])
            scores.append(result.scores[:, 0])
        best_time = min(best_time, seconds)
    return Decoded(hyps, refs, srcs, torch.cat(logprobs), torch.cat(scores), best_time)


def score(hyps: list[str], refs: list[str]) -> tuple[float, float]:
    """(BLEU 0-100, exact match 0-1), the test's own definitions."""
    m = TranslationMetrics(num_buckets=2)  # one bucket would come back as a 0-d tensor
    m.update(hyps, refs, torch.zeros(len(hyps), dtype=torch.long))
    out = m.compute(["all", "unused"])
    return float(out["bleu"]), float(out["exact_match"])
