"""A finished run's last lines (attnlab.runs.summary) for every family: the folder, last.ckpt, the explorer
page and the next commands, whose paths read back exactly through the shell and Hydra's override parser. Through
train.py: tests/test_first_hour.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from helpers import compose_train
from hydra.core.override_parser.overrides_parser import OverridesParser

from attnlab.families import families
from attnlab.core.paths import ROOT
from attnlab.runs.summary import entry, summary_lines
from attnlab.runs.sweep import setting_overrides

SERVES = {"translate.py": "translate", "generate.py": "generate", "synthesize.py": "synthesize",
          "train.py ckpt_path=... train=false": "test"}


def fake_run(run_dir: Path) -> Path:
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run_dir / "attention").mkdir()
    (run_dir / "attention" / "explorer.html").write_text("")
    return run_dir / "checkpoints" / "last.ckpt"


def hydra_value(command: str, key: str) -> str:
    """What ``key=`` of a printed command is to the entry point: the shell's words, then Hydra's parser."""
    words = shlex.split(command.split("|")[-1])
    (word,) = [w for w in words if w.startswith(f"{key}=")]
    return OverridesParser.create().parse_override(word).value()


def rows(lines: list[str]) -> dict[str, str]:
    return dict((part.strip() for part in line.split(":", 1)) for line in lines[1:])


@pytest.mark.parametrize("family", families(), ids=lambda f: f.name)
def test_every_family_gets_its_command_and_the_explorer(family, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # paths are shown relative to the current directory
    run_dir = tmp_path / "outputs" / "we, (them) it's" / "run"  # a folder Hydra and the shell both must quote
    ckpt = fake_run(run_dir)
    cfg = compose_train([f"model={family.name}", "debug=fast"], run_dir)
    lines = summary_lines(cfg, run_dir, [f"model={family.name}", "debug=fast", "seed=3", "logger=csv"])
    assert lines[0] == "finished:"
    got = rows(lines)
    relative = ckpt.relative_to(tmp_path)
    assert shlex.split(got["run folder"]) == [str(run_dir.relative_to(tmp_path))]
    assert shlex.split(got["last checkpoint"]) == [str(relative)]
    page, _ = got["attention explorer"].rsplit(" (", 1)
    assert shlex.split(page) == [str(run_dir.relative_to(tmp_path) / "attention" / "explorer.html")]
    label = SERVES[family.serves]
    command = got[label]
    assert hydra_value(command, "ckpt_path" if label == "test" else "ckpt") == str(relative)
    if label == "test":  # the same model and data, without the seed and bookkeeping
        assert f"model={family.name} " in command and "debug=fast" in command and "seed" not in command
        assert command.endswith(" train=false") and "logger" not in command
    assert hydra_value(got["explore"], "ckpt") == str(relative)
    assert got["explore"].startswith("python -m attnlab.explore ")
    if family.explorer_input != "image":
        assert hydra_value(got["explore"], "text")


def test_the_commands_read_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    fake_run(run_dir)
    lm = rows(summary_lines(compose_train(["model=causal_lm"], run_dir), run_dir))
    assert hydra_value(lm["generate"], "prompt") == "The for statement"
    mt = rows(summary_lines(compose_train([], run_dir), run_dir))
    assert mt["translate"].startswith("echo 'two thousand and twenty-six' | ")
    assert hydra_value(mt["explore"], "text") == "two thousand and twenty-six"


def test_without_a_checkpoint_only_the_folder(tmp_path):
    """train=false, or checkpointing off: no last.ckpt in the run, so no command that would read one."""
    (tmp_path / "run").mkdir()
    lines = summary_lines(compose_train(["train=false"], tmp_path / "run"), tmp_path / "run")
    assert [line.split(":")[0].strip() for line in lines] == ["finished", "run folder"]


def test_entry_points_from_the_checkout_or_anywhere(tmp_path):
    assert entry("translate", ROOT) == "python translate.py"
    assert entry("translate", tmp_path) == "python -m attnlab.translate"  # a wheel, or another directory


@pytest.mark.parametrize("overrides", [["model=vit", "+trainer.limit_train_batches=2"],
                                       ["model=vit", "++trainer.max_epochs=1", "data.batch_size=8"],
                                       ["model=vit", "~callbacks.throughput"]])
def test_the_test_command_composes_as_printed(overrides, tmp_path, monkeypatch):
    """The printed test command's overrides are the run's as typed (a key added with + keeps it): Hydra composes
    them again (it refuses `trainer.limit_train_batches=2` without the +)."""
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    fake_run(run_dir)
    lines = summary_lines(compose_train(overrides, run_dir), run_dir, overrides)
    words = shlex.split(rows(lines)["test"])
    printed = [w for w in words if ("=" in w or w.startswith("~")) and not w.startswith(("ckpt_path=", "train="))]
    assert printed == setting_overrides(overrides, as_typed=True) and "model=vit" in printed
    assert [w for w in printed if w.lstrip("+~") != w] == [o for o in overrides if o.lstrip("+~") != o]
    compose_train(printed, run_dir)  # composes as the user would run it
