"""Translation metrics: BLEU and chrF equal the sacrebleu package's on fixed text; per-bucket exact match."""

from __future__ import annotations

import math

import pytest
import sacrebleu
import torch

from attnlab.metrics.translation import BucketAccuracy, TranslationMetrics

HYPS = ["vingt et un", "deux mille six cent quatre", "un million quatre-vingt-dix mille", "sept cent", "treize"]
REFS = ["vingt et un", "deux mille six cent quatre", "un million quatre-vingts mille", "sept cents", "quatorze"]


def test_bleu_and_chrf_equal_sacrebleu():
    m = TranslationMetrics(num_buckets=2)
    m.update(HYPS[:2], REFS[:2], torch.tensor([0, 1]))  # two updates: corpus statistics must accumulate
    m.update(HYPS[2:], REFS[2:], torch.tensor([1, 0, 0]))
    out = m.compute(["1-3", "4+"])
    assert float(out["bleu"]) == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score, abs=1e-3)
    assert float(out["chrf"]) == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score, abs=1e-3)
    assert float(out["exact_match"]) == pytest.approx(2 / 5)
    # bucket 0: sentences 0 (right), 3, 4 (wrong); bucket 1: sentences 1 (right), 2 (wrong)
    assert float(out["exact_match_len_1-3"]) == pytest.approx(1 / 3)
    assert float(out["exact_match_len_4+"]) == pytest.approx(1 / 2)


def test_bucket_accuracy_is_nan_for_an_empty_bucket_and_resets():
    acc = BucketAccuracy(3)
    acc.update(torch.tensor([0, 0, 2]), torch.tensor([True, False, True]))
    out = acc.compute()
    assert out[0] == 0.5 and math.isnan(out[1]) and out[2] == 1.0
    acc.reset()
    acc.update(torch.tensor([1]), torch.tensor([True]))
    assert acc.compute()[1] == 1.0 and math.isnan(acc.compute()[0])
