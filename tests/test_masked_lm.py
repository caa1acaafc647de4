"""model=masked_lm, the encoder-only masked LM (BERT): its 80/10/10 masking, a bidirectional encoder, and the
family's promises through `python train.py` (trains on the LM's text, logs attention maps and the explorer page, is
served by `train.py ckpt_path=... train=false`, refused by generate.py in one line). Exact resume, the variants and
the configs cover it through the registry (tests/test_exact_resume.py, test_variants.py, test_configs.py)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import run_cli

from attnlab.models.masked_lm import MaskedLM
from attnlab.modules.attention import capture_attention
from attnlab.tasks.masked_lm import mask_tokens


def test_masking_chooses_15_percent_and_corrupts_them_80_10_10():
    ids = torch.randint(4, 1000, (64, 512), generator=torch.Generator().manual_seed(1))
    inputs, chosen = mask_tokens(ids, mask_id=1000, generator=torch.Generator().manual_seed(0))
    assert abs(chosen.float().mean().item() - 0.15) < 0.005
    assert torch.equal(inputs[~chosen], ids[~chosen])  # only chosen positions change
    picked, was = inputs[chosen], ids[chosen]
    masked, kept = (picked == 1000).float().mean().item(), (picked == was).float().mean().item()
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.1) < 0.01, (masked, kept)  # the rest (~10%): random tokens
    assert picked.min() >= 4  # a random replacement is never a special token
    again, chosen_again = mask_tokens(ids, mask_id=1000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, inputs) and torch.equal(chosen_again, chosen)  # validation: the same every epoch


def test_every_position_reads_both_sides():
    torch.manual_seed(0)
    net = MaskedLM(vocab_size=40, d_model=16, n_layers=1, n_heads=2, max_len=12, dropout=0.0).eval()
    ids = torch.randint(4, 40, (1, 12))
    later = ids.clone()
    later[0, -1] = 4 if ids[0, -1] != 4 else 5
    with torch.no_grad(), capture_attention(net) as maps:
        first = net(ids)
    assert not torch.allclose(first[0, 0], net(later)[0, 0])  # the first position sees the last token
    (weights,) = maps.values()
    assert weights[0].triu(1).sum() > 0.1  # attention above the diagonal: not causal
    assert first.shape[-1] == 41 and net.mask_id == 40  # the [MASK] row


@pytest.mark.slow  # the suite's 10-minute budget: by default the masked LM trains in test_exact_resume, test_variants and the explorer's tests
def test_trains_logs_maps_and_is_served_by_train_py(tmp_path, cache_dir):
    common = ["model=masked_lm", "debug=fast", "logger=csv", "callbacks.rich_progress_bar=null",
              "trainer.enable_progress_bar=false"]
    out = run_cli([*common, f"hydra.run.dir={tmp_path}/run"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    run = tmp_path / "run"
    trained = json.loads((run / "metrics.json").read_text())
    assert 0 <= trained["val/acc"] <= 1 and trained["val/loss"] < 6.3  # ln(512) = 6.24 at chance
    assert (run / "attention" / "explorer.html").is_file()
    assert sorted(p.name for p in run.glob("attention_maps/*/*.png")) == [
        "net.encoder.layers.0.self_attn.png", "net.encoder.layers.1.self_attn.png"]
    ckpt = run / "checkpoints" / "last.ckpt"
    served = run_cli([*common, f"ckpt_path={ckpt}", "train=false", f"hydra.run.dir={tmp_path}/serve"], cache_dir)
    assert served.returncode == 0, served.stdout[-3000:]
    test = json.loads((tmp_path / "serve" / "metrics.json").read_text())
    assert test["test/loss"] == trained["test/loss"] and test["test/acc"] == trained["test/acc"]  # the same weights
    refused = run_cli([f"ckpt={ckpt}", "prompt=x"], cache_dir, script="generate.py")
    assert refused.returncode == 2 and "Traceback" not in refused.stdout
    assert ("is a masked language model checkpoint, not a language-model checkpoint; use train.py ckpt_path=... "
            "train=false") in refused.stdout
