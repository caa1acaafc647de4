"""A label-smoothed training loss comes with the plain cross-entropy of the same batch (``train/nll``), on the scale
of ``val/loss``: a smoothed loss has a floor above 0, and a curve of it beside the validation loss misleads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import compose_train

from attnlab.core.special_tokens import PAD_ID
from attnlab.runs.build import build_model

TRANSLATION = ["transformer_mt", "transformer_nat", "seq2seq_attention"]


def _translation_batch(vocab: int, g: torch.Generator) -> dict:
    src, tgt = torch.randint(4, vocab, (3, 7), generator=g), torch.randint(4, vocab, (3, 6), generator=g)
    tgt[0, -2:] = PAD_ID
    return {"src": src, "src_mask": torch.ones_like(src, dtype=torch.bool), "tgt_in": tgt, "tgt_out": tgt,
            "tgt_mask": tgt != PAD_ID}


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("model", [*TRANSLATION, "vit"])
def test_a_smoothed_training_loss_logs_the_plain_one_too(model, smoothing, tmp_path):
    cfg = compose_train([f"model={model}", "debug=fast", f"model.label_smoothing={smoothing}"], tmp_path)
    task = build_model(cfg.model, cfg.optim, cfg.sched)
    g = torch.Generator().manual_seed(0)
    if model == "vit":
        net = cfg.model.net
        batch = {"image": torch.randn(3, net.in_channels, net.image_size, net.image_size, generator=g),
                 "label": torch.randint(0, net.num_classes, (3,), generator=g)}
    else:
        batch = _translation_batch(int(cfg.model.net.vocab_size), g)
    with torch.no_grad():  # predictions far from uniform (a zero-initialized head gives both losses log V)
        for p in task.parameters():
            p.normal_(0.0, 0.5, generator=g)
    task.eval()  # no dropout: the forward below sees what the step saw
    out = task.step(batch, "train")
    if not smoothing:
        assert "nll" not in out.metrics
        return
    with torch.no_grad():
        if model == "vit":
            logits, target = task(batch["image"]), batch["label"]
        elif model == "transformer_nat":
            logits, target = task.net.forward_with_length(batch["src"], batch["src_mask"], batch["tgt_in"])[0], \
                batch["tgt_out"]
        else:
            logits, target = task(batch["src"], batch["src_mask"], batch["tgt_in"]), batch["tgt_out"]
    logits, target = logits.flatten(0, -2).float(), target.flatten()
    plain = F.cross_entropy(logits, target, ignore_index=PAD_ID)
    smoothed = F.cross_entropy(logits, target, ignore_index=PAD_ID, label_smoothing=smoothing)
    assert not out.metrics["nll"].requires_grad
    assert torch.allclose(out.metrics["nll"], plain, atol=1e-5) and torch.allclose(out.metrics["loss"], smoothed,
                                                                                    atol=1e-5)
    assert not torch.allclose(plain, smoothed)
