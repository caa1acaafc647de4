"""attnlab.runs.history reads a run's curves back locally: the W&B offline log (the default logger) gives the same
steps and values as the CSV logger of the same run."""

from __future__ import annotations

import pytest
from helpers import compose_train

from attnlab.runs.history import read_csv_history, read_history, read_wandb_history
from attnlab.cli.train import run

pytestmark = pytest.mark.usefixtures("one_thread")


def test_wandb_offline_history_matches_the_csv_logger(tmp_path, cache_dir):
    cfg = compose_train(["model=causal_lm", "debug=fast", "logger=[csv,wandb]", "callbacks.rich_progress_bar=null",
                         "trainer.enable_progress_bar=false", "trainer.max_epochs=2"], tmp_path, cache_dir)
    metrics = run(cfg)
    from_csv, from_wandb = read_csv_history(tmp_path), read_wandb_history(tmp_path)
    assert from_wandb.source.endswith(".wandb") and "offline-run-" in from_wandb.source
    for key in ("train/loss", "val/loss", "val/ppl", "test/loss"):
        csv_steps, csv_values = from_csv.series(key)
        wandb_steps, wandb_values = from_wandb.series(key)
        assert csv_values, key
        assert wandb_steps == csv_steps, key
        assert wandb_values == pytest.approx(csv_values, rel=1e-6), key
    assert len(from_wandb.series("val/loss")[1]) == 2  # one point per validation epoch
    assert from_wandb.series("val/loss")[1][-1] == pytest.approx(metrics["val/loss"], rel=1e-6)
    # images logged to W&B (attention maps) are not metrics
    assert not any(k.startswith("attention/") for k in from_wandb.keys())
    assert read_history(tmp_path).source == from_csv.source  # the CSV wins when both exist


def test_no_logger_history_says_why(tmp_path):
    history = read_history(tmp_path)
    assert history.rows == []
    assert "no CSV metrics" in history.source and "no wandb/offline-run-" in history.source
