"""A new user's first `python train.py` on a busy machine, its output piped (nohup, CI, `| tee`): the torch threads
it chose and why, progress lines on stdout and in train.log, and last lines that name the run folder, last.ckpt,
the attention explorer and the next commands with the paths filled in. One run per family, shared by the tests.
The rule itself, over its whole input space: tests/utils/test_threads.py; the last lines of every family:
tests/utils/test_run_summary.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import one_error_line
from helpers import run_cli
from preloaded_python import run as run_python

from attnlab.families import get
from attnlab.core.paths import ROOT

FAMILIES = ("transformer_mt", "causal_lm", "vit")
COMMAND = {"transformer_mt": "translate", "causal_lm": "generate", "vit": "test"}
STEP = re.compile(r"epoch 1/1, step (\d+)/(\d+), train/loss [\d.e+-]+, [\d.]+ (steps/s|s/step), elapsed [\d:]+, "
                  r"left ~[\d:]+$")


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # without colorlog's colours


@pytest.fixture(scope="module", params=FAMILIES)
def finished(request, tmp_path_factory, cache_dir) -> tuple[str, Path, str]:
    """(family, run folder, the run's output): ``debug=fast``, piped, a progress line every step."""
    name = request.param
    run_dir = tmp_path_factory.mktemp(name) / "run"
    # the translation run keeps the OMP_NUM_THREADS a user set (the test workers set 1); the others set threads=1
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")} if name == "transformer_mt" else None
    args = [f"model={name}", "debug=fast", "logger=csv", "callbacks.rich_progress_bar.every_s=0.01",
            *get(name).test_overrides, f"hydra.run.dir={run_dir}"] + ([] if env else ["threads=1"])
    out = run_cli(args, cache_dir, env=env)
    assert out.returncode == 0, out.stdout[-3000:]
    return name, run_dir, plain(out.stdout)


def test_the_threads_line(finished):
    name, run_dir, output = finished
    (line,) = [line for line in output.splitlines() if "torch threads:" in line]
    if name == "transformer_mt":
        n = os.environ.get("OMP_NUM_THREADS", "1")
        assert line.endswith(f"torch threads: {n} (OMP_NUM_THREADS={n}; threads=N overrides it)")
    else:
        assert line.endswith("torch threads: 1 (threads=1)")
    assert line in plain((run_dir / "train.log").read_text())


def test_progress_lines_on_stdout_and_in_train_log(finished):
    name, run_dir, output = finished
    log = plain((run_dir / "train.log").read_text())
    lines = [line.split(" - ", 1)[1] for line in output.splitlines() if "[attnlab.callbacks.progress]" in line]
    steps = [m for m in map(STEP.search, lines) if m]
    assert len(steps) >= 2, output[-3000:]
    assert [int(m[1]) for m in steps] == sorted({int(m[1]) for m in steps})  # step counts up
    assert {int(m[2]) for m in steps} == {8}  # of debug=fast's 8
    assert any(line.startswith("epoch 1/1 validated (step 8): ") and "val/" in line for line in lines)
    assert "training done: step 8 in " in "\n".join(lines)
    for line in lines:
        assert f" - {line}" in log


def test_the_last_lines_say_where_everything_is(finished):
    name, run_dir, output = finished
    tail = output[output.rindex("finished:"):].splitlines()
    rows = dict((part.strip() for part in line.split(":", 1)) for line in tail[1:] if ":" in line)
    assert shlex.split(rows["run folder"]) == [str(run_dir)]
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert ckpt.is_file() and shlex.split(rows["last checkpoint"]) == [str(ckpt)]
    assert rows["attention explorer"] == f"{run_dir / 'attention' / 'explorer.html'} (open it in a browser)"
    assert (run_dir / "attention" / "explorer.html").is_file()
    command = rows[COMMAND[name]]
    assert f"ckpt{'_path' if name == 'vit' else ''}={ckpt}" in shlex.split(command.split("|")[-1])
    words = shlex.split(command.split("|")[-1])
    assert words[:2] == ["python", {"translate": "translate.py", "generate": "generate.py",
                                    "test": "train.py"}[COMMAND[name]]]
    if name == "vit":  # a test run of the checkpoint: this run's model and data, not its threads or logger
        assert {"model=vit", "debug=fast", "data.crop_padding=1", "train=false"} <= set(words)
        assert not any(w.startswith(("threads=", "logger=", "hydra.")) for w in words)
    assert shlex.split(rows["explore"])[:4] == ["python", "-m", "attnlab.explore", f"ckpt={ckpt}"]
    assert "finished:" in (run_dir / "train.log").read_text()


def test_threads_chosen_without_a_setting(tmp_path, cache_dir):
    """No OMP_NUM_THREADS, threads=auto: the rule's choice, and why (a new interpreter: the variable differs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTEST_XDIST_WORKER")}
    env.update(WANDB_SILENT="true", PYTHONUNBUFFERED="1", ATTNLAB_CACHE=cache_dir)
    out = run_python([sys.executable, "train.py", "debug=fast", "train=false", "test=false", "logger=none",
                      "callbacks=none", f"hydra.run.dir={tmp_path}/run"], cwd=ROOT, env=env, timeout=300,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert out.returncode == 0, out.stdout[-3000:]
    line = one_error_line(out.stdout, "torch threads:")
    m = re.search(r"torch threads: (\d+) \(load [\d.]+( and \d+ other process(es)? running)? on (\d+) cores; set "
                  r"threads=N to choose\)$", line)
    assert m, line
    assert 1 <= int(m[1]) <= int(m[4]) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("override,key", [("threads=0", "threads"), ("threads=two", "threads"),
                                          ("callbacks.rich_progress_bar.every_s=0", "every_s"),
                                          ("callbacks.rich_progress_bar.style=fancy", "style")])
def test_a_bad_setting_is_one_line(override, key, tmp_path, cache_dir):
    out = run_cli(["debug=fast", override, f"hydra.run.dir={tmp_path}/run"], cache_dir)
    assert out.returncode == 2
    line = one_error_line(out.stdout, override.split("=")[0])
    assert key in line and not (tmp_path / "run").exists()
