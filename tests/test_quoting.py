"""Paths in commands survive Hydra's override parser and the shell: every printable ASCII character (and a few
non-ASCII ones, runs of backslashes, ``${``) in a path, alone and together, comes back as the same path through
``hydra.run.dir=<hydra_value(path)>`` (what a DDP rank re-parses, src/attnlab/runs/ddp.py) and through the shell word of
a printed hint (``resume=...``, ``ckpt_path=...``, ``wandb sync ...``)."""

from __future__ import annotations

import shlex
import string

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from attnlab.core.quoting import hydra_value, shell_override, shell_path
from attnlab.core.errors import DamagedCheckpointError
from attnlab.runs.resume import check_intact

SPECIAL = [c for c in string.punctuation + " \t" if c != "/"]
PATHS = ([f"/tmp/a{c}b" for c in SPECIAL] + [f"/tmp/{c}" for c in SPECIAL]
         + ["/tmp/" + "".join(SPECIAL), "/tmp/a\\${b}", "/tmp/a\\\\${b}", "/tmp/end\\", "/tmp/é ü 中", "1e3", "true",
            "null", "/tmp/${x}", "/tmp/x y, (z) [w] {v} 'q' \"r\""])


def _parsed(override: str) -> str:
    value = OverridesParser.create().parse_override(override).value()
    return OmegaConf.create({"v": value}).v  # the escapes Hydra leaves to OmegaConf (``\${``) resolved too


@pytest.mark.parametrize("path", PATHS)
def test_a_path_comes_back_from_hydra_and_the_shell(path):
    assert _parsed(f"hydra.run.dir={hydra_value(path)}") == path
    (word,) = shlex.split(shell_override("resume", path))
    assert _parsed(word) == path
    assert shlex.split(f"wandb sync {shell_path(path)}")[2] == path


def test_a_plain_path_stays_as_it_is():
    assert hydra_value("/work/outputs/train/runs/2026-01-01_10-00-00-123") == \
        "/work/outputs/train/runs/2026-01-01_10-00-00-123"
    assert shell_override("resume", "/a/b.ckpt") == "resume=/a/b.ckpt"


def test_the_damaged_checkpoint_hint_is_a_command_that_works(tmp_path):
    run = tmp_path / "run a, (b) 'c'" / "checkpoints"
    run.mkdir(parents=True)
    torch.save({"x": 1}, run / "epoch_000.ckpt")
    (run / "last.ckpt").write_bytes((run / "epoch_000.ckpt").read_bytes()[:50])  # cut short
    with pytest.raises(DamagedCheckpointError) as e:
        check_intact(run / "last.ckpt", option="resume")
    hint = str(e.value).split(" with ", 1)[1]
    (word,) = shlex.split(hint)
    assert _parsed(word) == str(run / "epoch_000.ckpt")
