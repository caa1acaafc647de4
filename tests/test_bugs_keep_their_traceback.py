"""A bug is not a bad input: planted in a function on an entry point's path (tests/planted_bug/sitecustomize.py), it
keeps its traceback and the command exits 1, where a guard used to report it as a damaged file or a bad setting
(a NameError in ``TranslationTask.__init__`` was "cannot build TranslationTask from its hyper_parameters (damaged?)",
exit 2). The functions are the ones whose callers held a broad ``except``: building the task from a checkpoint, the
tokenizer it carries, the fit check of its weights, a part built from a config, the explorer page, the run's model
size check; one per entry point that reaches them. The one-line refusals of bad inputs are tested where they are
(tests/test_checkpoint_is_data.py, tests/test_bad_inputs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import TINY

from attnlab.core.errors import ConfigError, find_user_error
from attnlab.core.paths import ROOT
from preloaded_python import run as run_python

PLANTED = Path(__file__).resolve().parent / "planted_bug"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

CASES = [
    ("translate.py", [f"ckpt={FIXTURES / 'legacy_transformer_mt.ckpt'}", "beam_size=1"],
     "attnlab.tasks.translation:TranslationTask.__init__:NameError"),
    ("generate.py", [f"ckpt={FIXTURES / 'legacy_causal_lm.ckpt'}", "max_new_tokens=2"],
     "attnlab.data.tokenizer:BPETokenizer.__init__:AttributeError"),
    ("synthesize.py", [f"ckpt={FIXTURES / 'legacy_tts.ckpt'}", "text=one"],
     "attnlab.checkpoints.state_fit:check_fits:TypeError"),
    ("-m attnlab.explore", [f"ckpt={FIXTURES / 'legacy_causal_lm.ckpt'}", "text=The"],
     "attnlab.explorer.page:page_html:NameError"),
    ("train.py", [*TINY, "ffn=swiglu"], "attnlab.modules.feedforward:FeedForward.__init__:AttributeError"),
    ("train.py", [*TINY, f"ckpt_path={FIXTURES / 'legacy_causal_lm.ckpt'}", "train=false", "test=true"],
     "attnlab.runs.load:model_config:TypeError"),
    ("train.py", [*TINY, "resume={tmp}/no_run"], "attnlab.runs.resume:model_identity:TypeError"),
    ("-m attnlab.compare", ["{tmp}/sweep", "--by", "norm"], "attnlab.runs.sweep_jobs:sweep_jobs:NameError"),
    ("-m attnlab.workspace", ["{tmp}/sweep"], "attnlab.runs.wandb_runs:offline_run_dirs:AttributeError"),
]


@pytest.mark.parametrize(("entry", "args", "bug"), CASES, ids=[f"{c[0]}-{c[2].split(':')[1]}" for c in CASES])
def test_a_planted_bug_keeps_its_traceback_and_exits_1(entry, args, bug, tmp_path, cache_dir):
    env = {**os.environ, "ATTNLAB_CACHE": cache_dir, "ATTNLAB_PLANT_BUG": bug, "WANDB_SILENT": "true",
           "PYTHONPATH": os.pathsep.join([str(PLANTED), os.environ.get("PYTHONPATH", "")])}
    env.pop("HYDRA_FULL_ERROR", None)
    plain = entry in ("-m attnlab.compare", "-m attnlab.workspace")  # (argparse commands: no Hydra run folder)
    hydra = [] if plain else [f"hydra.run.dir={tmp_path / 'run'}"]
    command = [sys.executable, *entry.split(), *(a.replace("{tmp}", str(tmp_path)) for a in args), *hydra]
    job = tmp_path / "sweep" / "0" / ".hydra"  # a job folder for compare and workspace (the bug comes first)
    job.mkdir(parents=True)
    (job / "overrides.yaml").write_text("- norm=pre\n")
    out = run_python(command, cwd=ROOT, env=env, input="one\n", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True, timeout=180)
    _, qualname, error = bug.split(":")
    assert out.returncode == 1, out.stdout[-3000:]
    assert "Traceback" in out.stdout and f"{error}: planted bug in {qualname}" in out.stdout, out.stdout[-3000:]
    assert "damaged" not in out.stdout and "cannot build" not in out.stdout, out.stdout[-3000:]


def test_an_error_raised_while_handling_a_bad_input_is_not_that_bad_input():
    """Only explicit causes count: a bug in an error path is a new failure, a wrapper's ``from e`` carries the
    refusal through."""
    try:
        try:
            raise ConfigError("model.net.n_heads=0: must be a positive integer")
        except ConfigError:
            raise NameError("a bug in the handler")  # noqa: B904 - the point: no `from`
    except NameError as e:
        assert find_user_error(e) is None
    refusal = ConfigError("bad")
    try:
        raise RuntimeError("Error in call to target") from refusal
    except RuntimeError as e:
        assert find_user_error(e) is refusal
