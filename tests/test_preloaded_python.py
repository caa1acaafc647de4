"""The tests' commands run in processes forked from a preloaded interpreter (tests/preloaded_python.py). Property:
for every way a command can end (success, a one-line refusal with exit 2, ``sys.exit`` with a message, an uncaught
exception, an uncaught KeyboardInterrupt, a kill by signal) and every way it reads its surroundings (argv, cwd,
environment, PYTHONPATH, stdin, stdout and stderr apart or merged), the forked process gives what a new interpreter
gives: the same exit status and the same output; and a real training run writes the same metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import preloaded_python
from attnlab.core.paths import ROOT
from attnlab.runs.wandb_runs import offline_run_dirs, read_offline_runs
from preloaded_python import run as run_python

PROBE = textwrap.dedent("""
    import os, signal, sys, time
    how = sys.argv[1]
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("PROBE_VALUE"), flush=True)
    print("stdin", sys.stdin.read().strip(), "main", __name__, "path0", sys.path[0] == os.path.dirname(__file__))
    print("to stderr", file=sys.stderr)
    import probe_helper  # found through PYTHONPATH only
    if how == "exit2":
        sys.exit(2)
    if how == "message":
        sys.exit("a message for stderr")
    if how == "raise":
        raise ValueError("boom")
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "sleep":
        time.sleep(60)
""")


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("probe")
    (folder / "probe.py").write_text(PROBE)
    (folder / "lib").mkdir()
    (folder / "lib" / "probe_helper.py").write_text("")
    return folder


@pytest.fixture(scope="module")
def server_env() -> dict[str, str]:
    """The environment the preloaded interpreter started with (a command's env may differ in what it reads late)."""
    if os.environ.get("ATTNLAB_TEST_FRESH_PROCESSES") == "1":
        pytest.skip("ATTNLAB_TEST_FRESH_PROCESSES=1: every command is a new interpreter")
    assert preloaded_python._SERVER.start(), "the preloaded interpreter did not start"
    return preloaded_python._SERVER.env


def _both(args, **kwargs) -> dict[str, subprocess.CompletedProcess]:
    before = preloaded_python._SERVER.served
    forked = run_python(args, **kwargs)
    assert preloaded_python._SERVER.served == before + 1  # it really went through the server
    return {"forked": forked, "fresh": subprocess.run(args, **kwargs)}


@pytest.mark.parametrize("how", ["ok", "exit2", "message", "raise", "interrupt", "kill"])
@pytest.mark.parametrize("merged", [True, False], ids=["2>&1", "apart"])
def test_a_forked_command_ends_and_prints_as_a_new_interpreter(probe, server_env, how, merged):
    env = {**server_env, "PROBE_VALUE": "x y", "PYTHONPATH": os.pathsep.join(["lib", *_path(server_env)])}
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if merged else {"capture_output": True}
    runs = _both([sys.executable, "probe.py", how, "two words"], cwd=probe, env=env, input="from stdin\n", text=True,
                 timeout=60, **streams)
    forked, fresh = runs["forked"], runs["fresh"]
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert "'two words'] cwd" in fresh.stdout and "stdin from stdin" in fresh.stdout  # the probe probes


def _path(env: dict[str, str]) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def test_a_module_run_with_dash_m_is_the_same(server_env):
    runs = _both([sys.executable, "-m", "attnlab.families"], cwd=ROOT, env=server_env, capture_output=True, text=True,
                 timeout=120)
    assert runs["forked"].returncode == runs["fresh"].returncode == 0
    assert runs["forked"].stdout == runs["fresh"].stdout


@pytest.mark.parametrize("value,forks", [("True", True), ("FALSE", False)])
def test_a_start_up_variable_a_preloaded_library_sets_keeps_commands_forked(probe, server_env, value, forks):
    """sklearn's import sets KMP_DUPLICATE_LIB_OK=True (setdefault) in the server, and in this process once a test
    imports it: a command with that environment still forks; one with another value gets a new interpreter."""
    import sklearn  # noqa: F401  (as a test importing it does)

    env = {**os.environ, "KMP_DUPLICATE_LIB_OK": value, "PYTHONPATH": os.pathsep.join(["lib", *_path(server_env)])}
    before = preloaded_python._SERVER.served
    out = run_python([sys.executable, "probe.py", "ok", "x"], cwd=probe, env=env, capture_output=True, text=True,
                     timeout=60)
    assert out.returncode == 0, out.stderr
    assert preloaded_python._SERVER.served == before + forks


@pytest.mark.parametrize("marked", [True, False], ids=["fork-safe", "unmarked"])
def test_a_sitecustomize_on_pythonpath_runs_before_the_script(tmp_path, server_env, marked):
    """A fork-safe sitecustomize (the disk-full injector's kind) is imported by the forked child before the script,
    as a new interpreter's site module imports it; an unmarked one gets a new interpreter. Either way the script
    sees what it set up."""
    site = tmp_path / "site"
    site.mkdir()
    mark = preloaded_python.FORK_SAFE + "\n" if marked else ""
    (site / "sitecustomize.py").write_text(mark + "import builtins, os\nbuiltins.SITE_SAW = os.environ['PROBE_VALUE']\n")
    (tmp_path / "script.py").write_text("import builtins\nprint('site saw', builtins.SITE_SAW)\n")
    env = {**server_env, "PROBE_VALUE": "this command's", "PYTHONPATH": os.pathsep.join([str(site), *_path(server_env)])}
    before = preloaded_python._SERVER.served
    out = run_python([sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert preloaded_python._SERVER.served == before + marked
    fresh = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert out.stdout == "site saw this command's\n"


def test_a_timeout_kills_the_command(probe, server_env):
    env = {**server_env, "PYTHONPATH": os.pathsep.join(["lib", *_path(server_env)])}
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_python([sys.executable, "probe.py", "sleep"], cwd=probe, env=env, capture_output=True, timeout=3)
    assert time.monotonic() - started < 30


TIMED = ("torch threads:", "[attnlab.callbacks.progress]")  # the load, the rates and the times left


def test_a_training_run_writes_what_a_fresh_interpreter_writes(tmp_path, cache_dir, server_env):
    """train.py through both, deterministic: the same exit status, the same losses in metrics.json, the same
    checkpoint files, the same keys in the offline W&B summary, the same lines in train.log."""
    env = {**server_env, "ATTNLAB_CACHE": cache_dir}
    args = [sys.executable, "train.py", "model=causal_lm", "debug=fast", "trainer.deterministic=true"]
    forked = run_python([*args, f"hydra.run.dir={tmp_path / 'forked'}"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)
    fresh = subprocess.run([*args, f"hydra.run.dir={tmp_path / 'fresh'}"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
    results = {}
    for name, out in (("forked", forked), ("fresh", fresh)):
        assert out.returncode == 0, out.stderr[-3000:]
        run_dir = tmp_path / name
        metrics = json.loads((run_dir / "metrics.json").read_text())
        (wandb_run,) = read_offline_runs(offline_run_dirs(run_dir))
        results[name] = ({k: v for k, v in metrics.items() if "loss" in k or "ppl" in k}, sorted(metrics),
                         sorted(p.name for p in (run_dir / "checkpoints").iterdir()),
                         sorted(k for k in wandb_run.summary if not k.startswith("_")),
                         json.dumps(wandb_run.config, sort_keys=True).replace(str(run_dir), "<run>"),
                         # what reached train.log (Lightning's lines too), without the time stamps, the data
                         # cache's lines (the first run fills it) and the lines that read the clock or the load
                         [line.split("]", 1)[-1].replace(str(run_dir), "<run>")
                          for line in (run_dir / "train.log").read_text().splitlines()
                          if cache_dir not in line and not any(t in line for t in TIMED)])
    assert results["forked"] == results["fresh"]
    assert results["fresh"][0]  # losses were compared
