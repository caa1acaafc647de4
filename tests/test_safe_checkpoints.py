"""Loading a checkpoint never runs code from it, through every entry point that reads one; and checkpoints written
before loading became ``weights_only=True`` still load.

The hostile file is a real torch.save'd pickle whose unpickling calls ``Path.touch(marker)``: with
``weights_only=False`` (what every loader did before) the marker appears the moment the file is read. Each entry
point must refuse it in one line naming the file, exit 2, and the marker must never appear.

``tests/fixtures/legacy_*.ckpt`` were written by train.py before this change (tiny models, 2 steps):
    python train.py model=causal_lm debug=fast model.net.d_model=16 model.net.n_layers=1 data.vocab_size=300 \
        data.seq_len=16 trainer.max_steps=2
    python train.py model=transformer_mt debug=fast model.net.d_model=16 model.net.n_layers=1 data.vocab_size=300 \
        data.seq_len=32 data.max_digits=4 data.train_size=400 data.val_size=40 data.test_size=40 trainer.max_steps=2
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch
from helpers import run_cli
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from attnlab.core.errors import CheckpointError, UnsafeCheckpointError
from attnlab.checkpoints.read import read_checkpoint, verified
from attnlab.core.paths import CONF_DIR, ROOT
from preloaded_python import run as run_python

FIXTURES = ROOT / "tests" / "fixtures"
LEGACY_LM = FIXTURES / "legacy_causal_lm.ckpt"
LEGACY_MT = FIXTURES / "legacy_transformer_mt.ckpt"
REFUSAL = "is not a safe attnlab checkpoint"
QUIET = ["logger=csv", "callbacks.rich_progress_bar=null", "trainer.enable_progress_bar=false"]


class Touch:
    """Unpickles as ``Path.touch(marker)``: any loader that runs pickled calls creates the marker file."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def hostile_checkpoint(path: pathlib.Path, marker: pathlib.Path, task_class: str) -> pathlib.Path:
    """Looks like what train.py writes (task_class, state_dict) with a code-running object inside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"task_class": task_class, "state_dict": {}, "hyper_parameters": {"x": Touch(marker)}}, path)
    return path


def cli(script: str, *args: str, stdin: str | bytes | None = None, cache_dir: str) -> subprocess.CompletedProcess:
    """An inference entry point as a user runs it, stdout and stderr apart (stdout carries translations); ``stdin``
    as text (UTF-8) or as raw bytes."""
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = run_python([sys.executable, script, *args], cwd=ROOT, env=env, input=data, capture_output=True,
                          timeout=180)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


def compose_cli(name: str, overrides: list[str]):
    """conf/<name>.yaml as the entry point sees it (for checking option rules without a subprocess each)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(name, overrides=overrides)


def assert_refused(proc: subprocess.CompletedProcess, ckpt: pathlib.Path, marker: pathlib.Path) -> None:
    out = proc.stdout + (proc.stderr or "")
    assert not marker.exists(), "loading the checkpoint ran code from it"
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if REFUSAL in line]
    assert len(lines) == 1 and str(ckpt) in lines[0] and "weights_only" in lines[0], out[-3000:]


def test_the_hostile_checkpoint_does_run_code_when_unpickled_unsafely(tmp_path):
    """The premise of the tests below: this file is dangerous, and read_checkpoint refuses it."""
    marker = tmp_path / "pwned"
    ckpt = hostile_checkpoint(tmp_path / "evil.ckpt", marker, "attnlab.tasks.causal_lm.CausalLMTask")
    torch.load(ckpt, weights_only=False)
    assert marker.exists()
    marker.unlink()
    for load in (read_checkpoint, verified):
        with pytest.raises(UnsafeCheckpointError, match=REFUSAL):
            load(ckpt)
    assert not marker.exists()


@pytest.mark.parametrize("script,args,task_class", [
    ("translate.py", [], "attnlab.tasks.translation.TranslationTask"),
    ("generate.py", [], "attnlab.tasks.causal_lm.CausalLMTask"),
    ("synthesize.py", ["text=one"], "attnlab.tasks.tts.TTSTask"),
], ids=["translate", "generate", "synthesize"])
def test_inference_entry_points_refuse_a_hostile_checkpoint(script, args, task_class, tmp_path, cache_dir):
    marker = tmp_path / "pwned"
    ckpt = hostile_checkpoint(tmp_path / "evil.ckpt", marker, task_class)
    proc = cli(script, f"ckpt={ckpt}", *args, f"hydra.run.dir={tmp_path / 'run'}", stdin="one\n",
               cache_dir=cache_dir)
    assert_refused(proc, ckpt, marker)


def test_train_test_only_refuses_a_hostile_checkpoint(tmp_path, cache_dir):
    marker = tmp_path / "pwned"
    ckpt = hostile_checkpoint(tmp_path / "evil.ckpt", marker, "attnlab.tasks.causal_lm.CausalLMTask")
    proc = run_cli(["model=causal_lm", "debug=fast", "train=false", f"ckpt_path={ckpt}", *QUIET,
                    f"hydra.run.dir={tmp_path / 'run'}"], cache_dir)
    assert_refused(proc, ckpt, marker)


def test_train_resume_refuses_a_hostile_last_ckpt(tmp_path, cache_dir):
    """resume=<run dir> whose checkpoints/last.ckpt was replaced: refused before training starts."""
    marker = tmp_path / "pwned"
    run_dir = tmp_path / "run"
    ckpt = hostile_checkpoint(run_dir / "checkpoints" / "last.ckpt", marker, "attnlab.tasks.causal_lm.CausalLMTask")
    proc = run_cli(["model=causal_lm", "debug=fast", f"resume={run_dir}", *QUIET], cache_dir)
    assert_refused(proc, ckpt, marker)


class _CallsSystem:
    def __reduce__(self):
        return (os.system, ("true",))  # harmless if it ever ran; the point is that it is refused by name


def test_a_blocked_module_global_is_named_as_unsafe(tmp_path):
    """torch words a refused global of a blocked module (os.system -> posix.system) differently from an
    unsupported one (builtins.getattr); both are "not a safe attnlab checkpoint"."""
    path = tmp_path / "system.ckpt"
    torch.save({"task_class": "attnlab.tasks.causal_lm.CausalLMTask", "x": _CallsSystem()}, path)
    with pytest.raises(CheckpointError, match=r"system.ckpt is not a safe attnlab checkpoint: .* refused \w+\.system"):
        read_checkpoint(path)


def test_unreadable_files_are_one_line_errors(tmp_path):
    text = tmp_path / "text.ckpt"
    text.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*text.ckpt: not a PyTorch checkpoint"):
        read_checkpoint(text)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(LEGACY_LM.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*cut.ckpt"):
        verified(cut)
    with pytest.raises(CheckpointError, match=r"checkpoint not found"):
        verified(tmp_path / "none.ckpt")
    assert verified(None) is None and verified("last") == "last"  # Lightning's own names pass through


def test_checkpoints_written_before_the_change_load_through_the_entry_points(tmp_path, cache_dir):
    for legacy in (LEGACY_LM, LEGACY_MT):
        assert legacy.stat().st_size < 300_000
        assert read_checkpoint(legacy)["task_class"].startswith("attnlab.tasks.")
    gen = cli("generate.py", f"ckpt={LEGACY_LM}", "max_new_tokens=4", "num_samples=2",
              f"hydra.run.dir={tmp_path / 'gen'}", cache_dir=cache_dir)
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert "--- sample 1 ---" in gen.stdout and (tmp_path / "gen" / "samples.txt").is_file()
    tr = cli("translate.py", f"ckpt={LEGACY_MT}", "beam_size=2", f"hydra.run.dir={tmp_path / 'tr'}",
             stdin="twenty-one\nseven\n", cache_dir=cache_dir)
    assert tr.returncode == 0, tr.stderr[-3000:]
    assert len(tr.stdout.splitlines()) == 2
