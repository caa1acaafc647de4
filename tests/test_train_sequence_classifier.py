"""train.py with model=sequence_classifier end to end (in process, debug=fast): accuracy, the per-distance test
accuracy file, attention maps and the explorer's whole-sequence page for the attention encoder only, and block
groups refused for the RNN/CNN encoders."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import compose_train, explorer_data

from attnlab.cli.train import run
from attnlab.core.errors import ConfigError
from attnlab.runs.config_tree import check_block_groups, used_groups

QUIET = ["callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false", "logger=csv"]


@pytest.mark.parametrize("encoder", ["attention", "rnn"])
def test_fast_run_writes_accuracy_by_distance(encoder, tmp_path):
    cfg = compose_train(["model=sequence_classifier", "debug=fast", f"model.encoder={encoder}", *QUIET], tmp_path)
    assert cfg.data._target_.endswith("NeedleRecallDataModule")  # the model brings its data set
    metrics = run(cfg)
    for key in ("train/loss", "val/acc", "test/acc"):
        assert key in metrics and torch.isfinite(torch.tensor(metrics[key])), key
    record = json.loads((tmp_path / "test_by_distance.json").read_text())
    assert record["encoder"] == encoder and record["seq_len"] == 32  # debug=fast: 32 tokens
    assert sum(record["total"]) == 2 * 8  # limit_test_batches=2 of batch_size 8
    assert abs(sum(record["correct"]) / sum(record["total"]) - metrics["test/acc"]) < 1e-6
    assert all(1 <= d <= 30 for d in record["distance"]) and record["params"] > 0
    maps = sorted(p.name for p in tmp_path.glob("attention_maps/*/*.png"))
    assert maps == (["query_attention.png"] if encoder == "attention" else [])  # rnn: nothing drawn, no error
    if encoder == "attention":  # the explorer keeps the whole sequence, past max_tokens=16: the readout, the needle
        modules = explorer_data(tmp_path)["modules"]
        assert modules and all(len(m["queries"]) == len(m["keys"]) == 32 for m in modules)
        assert modules[0]["queries"][-1] == "?" and sum(t.isdigit() for t in modules[0]["queries"]) == 1


def test_block_groups_apply_to_the_attention_encoder_only(tmp_path):
    for encoder, uses in (("attention", ["norm", "ffn", "moe", "attn", "pos"]), ("rnn", []), ("cnn", [])):
        cfg = compose_train(["model=sequence_classifier", f"model.encoder={encoder}"], tmp_path)
        assert used_groups(cfg) == uses
    check_block_groups(cfg, ["model.encoder=cnn", "trainer.max_epochs=1"])
    with pytest.raises(ConfigError, match="norm= does not apply to model=sequence_classifier"):
        check_block_groups(cfg, ["model.encoder=cnn", "norm=rms"])
    cfg = compose_train(["model=sequence_classifier", "norm=rms"], tmp_path)
    check_block_groups(cfg, ["norm=rms"])  # the attention encoder is built from it
