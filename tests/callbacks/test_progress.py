"""The progress display (attnlab.callbacks.progress): Rich's bar on a terminal, log lines otherwise, and how a
line reads. The lines of a real run, on stdout and in train.log: tests/test_first_hour.py."""

from __future__ import annotations

import io

import pytest
from lightning.pytorch.callbacks import RichProgressBar

from attnlab.callbacks.progress import ProgressLines, clock, loss_key, progress_display, rate_text


class FakeStdout(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("style,tty,kind", [("auto", True, RichProgressBar), ("auto", False, ProgressLines),
                                            ("bar", False, RichProgressBar), ("lines", True, ProgressLines)])
def test_the_bar_on_a_terminal_lines_otherwise(style, tty, kind, monkeypatch):
    monkeypatch.setattr("sys.stdout", FakeStdout(tty))
    shown = progress_display(style, every_s=2.5)
    assert type(shown) is kind
    if kind is ProgressLines:
        assert shown.every_s == 2.5


@pytest.mark.parametrize("seconds,text", [(0, "0:00:00"), (59.6, "0:01:00"), (3725, "1:02:05"),
                                          (50 * 3600, "50:00:00"), (-3, "0:00:00")])
def test_clock(seconds, text):
    assert clock(seconds) == text


@pytest.mark.parametrize("steps,seconds,text", [(10, 2, "5 steps/s"), (1, 7.8, "7.8 s/step"), (3, 1, "3 steps/s"),
                                                (0, 1, ""), (5, 0, "")])
def test_rate(steps, seconds, text):
    assert rate_text(steps, seconds) == text


@pytest.mark.parametrize("metrics,key", [({"train/loss": 1, "train/acc": 0}, "train/loss"),
                                         ({"train/mel_loss": 1, "val/loss": 2}, "train/mel_loss"),
                                         ({"val/loss": 2}, None)])
def test_the_loss_each_family_logs(metrics, key):
    assert loss_key(metrics) == key


def test_a_run_saved_with_richs_bar_still_loads(tmp_path):
    """Run folders saved before the display named Lightning's RichProgressBar there: read as today's target (the
    allow-list is computed from conf/, which no longer names it)."""
    import hydra
    from omegaconf import OmegaConf

    from attnlab.checkpoints.allowed_targets import load_config

    path = tmp_path / "config.yaml"
    OmegaConf.save({"callbacks": {"rich_progress_bar": {"_target_": "lightning.pytorch.callbacks.RichProgressBar"}}},
                   path)
    cfg = load_config(path)
    assert isinstance(hydra.utils.instantiate(cfg.callbacks.rich_progress_bar), (RichProgressBar, ProgressLines))
