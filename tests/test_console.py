"""What the default job prints, as a user sees it: each of Lightning's lines once, the model summary without a
FLOPs column that reads 0, and none of the notices about Lightning's and W&B's own workings; the same in train.log."""

from __future__ import annotations

import pytest
from helpers import run_cli

NOT_SHOWN = ["Total FLOPs", "💡 Tip", "LeafSpec", "anonymous setting has no effect", "Trainer already configured",
             "to estimate number of stepping batches", "INFO: "]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, cache_dir):
    run = tmp_path_factory.mktemp("console") / "run"
    out = run_cli(["debug=fast", "trainer.limit_train_batches=2", "test=false", f"hydra.run.dir={run}"], cache_dir)
    assert out.returncode == 0, out.stdout[-3000:]
    return out.stdout, (run / "train.log").read_text()


@pytest.mark.parametrize("text", NOT_SHOWN)
def test_notices_that_are_not_the_users_are_not_printed(text, default_run):
    printed, logged = default_run
    assert text not in printed and text not in logged


@pytest.mark.parametrize("line", ["Seed set to 42", "GPU available: False", "model summary:"])
def test_each_line_is_printed_once_and_logged(line, default_run):
    printed, logged = default_run
    assert printed.count(line) == 1 and logged.count(line) == 1, printed[-3000:]


def test_the_summary_counts_the_parameters(default_run):
    printed, _ = default_run
    summary = printed.split("model summary:", 1)[1].split("\n")
    assert "| Params" in summary[1] and "FLOPs" not in summary[1]
    assert any("trainable params" in line and "in all" in line for line in summary[:10])
