"""Every bad input gets one line: a real ``python train.py`` on a real bad file or a bad config value exits with
status 2 and prints one error line naming the file (and line / byte offset) or the key, the value and what is
allowed, with no traceback. Each case stops before any training step; a bad data file before torch and Lightning
are imported (read by train.py's data preflight, attnlab.runs.data_check): ~0.8 s of CPU on a small machine.

The same checks one level down (every message, in-process) live in tests/data/, tests/audio/, tests/models/test_vit.py
and tests/utils/test_validate.py; this file is the promise where the user meets it.

The second half tests it as a property over a generated space (tests/bad_values.py): every config key kind of every
model, in-process against the validator train.py runs, and one case per kind through train.py and each inference
command (refused before Lightning is imported: ~2-4 s of CPU each).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from bad_values import UNSET_ENV, apply, cases_for, cli_cases, sample
from helpers import compose_train, run_cli
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from attnlab.data.ljspeech import write_ljspeech
from attnlab.core.errors import ConfigError, UserError
from attnlab.core.paths import CONF_DIR, ROOT
from attnlab.core.quoting import hydra_value
from attnlab.runs.validate import validate_config
from vision_helpers import write_tiny_cifar
from preloaded_python import run as run_python

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FAST = ["debug=fast", "logger=none", "callbacks=none", "trainer=cpu"]


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    """One folder of real bad inputs."""
    d = tmp_path_factory.mktemp("bad_inputs")
    (d / "one_column.tsv").write_text("Hello.\tBonjour.\nno tab here\nBye.\tSalut.\n", encoding="utf-8")
    (d / "empty.tsv").write_bytes(b"")
    (d / "latin1.tsv").write_bytes("Hi.\tSalut.\nCoffee.\tCaf\xe9.\n".encode("latin-1"))  # 0xe9 at byte 22, line 2
    (d / "a_folder.tsv").mkdir()
    (d / "empty.txt").write_bytes(b" \n\n")
    (d / "cifar_is_a_file").write_text("not a folder\n")
    (d / "pairs.jsonl").write_text("".join(json.dumps({"en": f"one {i}", "fr": f"un {i}"}) + "\n" for i in range(40)))
    (d / "broken.jsonl").write_text(json.dumps({"en": "a", "fr": "b"}) + '\n{"en": \n')
    write_tiny_cifar(d / "cifar_empty_batch", n_per_batch=10)
    (d / "cifar_empty_batch" / "data_batch_3").write_bytes(b"")
    # an LJSpeech folder whose second WAV was cut to half its bytes (an interrupted copy): libsndfile reads it
    # without complaint, so this would otherwise train on half an utterance
    t = np.arange(11025) / 22050
    items = [(f"u{i}", f"utterance number {i}", (np.sin(2 * np.pi * 220 * (i + 1) * t) * 8000).astype(np.int16))
             for i in range(4)]
    write_ljspeech(d / "ljspeech", items, 22050)
    wav = d / "ljspeech" / "wavs" / "u1.wav"
    wav.write_bytes(wav.read_bytes()[: wav.stat().st_size // 2])
    return d


# (id, train.py arguments with {bad} for the folder above, the message's distinctive part, what else the line names)
CASES = [
    # a translation corpus (data=tsv)
    ("tsv-one-column", ["model=transformer_mt", "data=tsv", "data.path={bad}/one_column.tsv"],
     "no tab between source and target", ["{bad}/one_column.tsv:2:", "'no tab here'"]),
    ("tsv-empty", ["model=transformer_mt", "data=tsv", "data.path={bad}/empty.tsv"],
     "parallel corpus has no sentence pairs", ["{bad}/empty.tsv"]),
    ("tsv-not-utf8", ["model=transformer_mt", "data=tsv", "data.path={bad}/latin1.tsv"],
     "parallel corpus is not valid UTF-8", ["{bad}/latin1.tsv:2", "byte offset 22", "0xe9"]),
    ("tsv-folder", ["model=transformer_mt", "data=tsv", "data.path={bad}/a_folder.tsv"],
     "parallel corpus is a folder, not a file", ["{bad}/a_folder.tsv"]),
    ("tsv-path-not-given", ["model=transformer_mt", "data=tsv"],
     "data.path is not set: give it on the command line (data.path=...)", []),
    # Hugging Face datasets from local files (data=hf)
    ("hf-missing-column", ["model=transformer_mt", "data=hf", "data.path={bad}/pairs.jsonl", "data.hf.src_column=english",
                           "data.hf.tgt_column=fr"],
     "has no column 'english' for the source (data.hf.src_column); its columns: en, fr", ["{bad}/pairs.jsonl"]),
    ("hf-broken-jsonl", ["model=transformer_mt", "data=hf", "data.path={bad}/broken.jsonl", "data.hf.src_column=en",
                         "data.hf.tgt_column=fr"],
     "datasets could not read", ["{bad}/broken.jsonl", "JSON parse error"]),
    # a language-model text (data=text_file)
    ("text-missing", ["model=causal_lm", "data=text_file", "data.path={bad}/nowhere.txt"],
     "text file not found", ["{bad}/nowhere.txt"]),
    ("text-empty", ["model=causal_lm", "data=text_file", "data.path={bad}/empty.txt"],
     "text file is empty", ["{bad}/empty.txt"]),
    # CIFAR-10 (data=cifar10)
    ("cifar-missing", ["model=vit", "data=cifar10", "data.path={bad}/no_cifar", "data.num_workers=0"],
     "CIFAR-10 folder not found", ["{bad}/no_cifar", "data.download=true"]),
    ("cifar-file-not-folder", ["model=vit", "data=cifar10", "data.path={bad}/cifar_is_a_file", "data.num_workers=0"],
     "CIFAR-10 folder is a file, not a folder", ["{bad}/cifar_is_a_file"]),
    ("cifar-empty-batch", ["model=vit", "data=cifar10", "data.path={bad}/cifar_empty_batch", "data.num_workers=0"],
     "malformed CIFAR-10 file", ["{bad}/cifar_empty_batch/data_batch_3", "not a readable pickle"]),
    # LJSpeech (data=ljspeech)
    ("ljspeech-truncated-wav", ["model=tts", "data=ljspeech", "data.path={bad}/ljspeech", "data.val_size=1",
                                "data.test_size=1"],
     "truncated: its header promises 22050 bytes of audio, the file holds 11003", ["{bad}/ljspeech/wavs/u1.wav"]),
    # model and optimizer settings
    ("d_model-not-a-number", ["model=causal_lm", "model.net.d_model=abc"],
     "model.net.d_model=abc: must be a positive integer", []),
    ("n_heads-zero", ["model=transformer_mt", "model.net.n_heads=0"],
     "model.net.n_heads=0: must be a positive integer", []),
    ("n_layers-zero", ["model=vit", "model.net.n_layers=0"],
     "model.net.n_layers=0: must be a positive integer", []),
    ("lr-negative", ["model=causal_lm", "model.optimizer.lr=-1"],
     "model.optimizer.lr=-1: must be a number > 0", []),
    ("norm-placement-unknown", ["model=causal_lm", "norm.placement=middle"],  # checked by the norm part, once
     "norm.placement=middle: choose one of pre, post", []),
    ("image-size-mismatch", ["model=vit", "data.image_size=16", "model.net.image_size=8"],
     "model.net.image_size=8 but data.image_size=16", ["set both alike"]),
    # a trainer for a machine this is not (Lightning's own answer is a 4-line instantiate traceback)
    ("ddp-without-gpu", ["model=causal_lm", "trainer=ddp"],
     "trainer.accelerator=gpu but this machine has no CUDA GPU", ["trainer=ddp_cpu"]),
]


# The data cases run by default in test_bad_data_is_refused_before_lightning (below: the same assertions, and that
# Lightning was not imported yet) and are unit-tested in tests/data/ (test_preflight.py: every message, in-process);
# here with `-m slow`. norm-placement-unknown: a part refusing its value when built, as image-size-mismatch does (its
# message is checked in-process in tests/modules/test_parts_and_block.py).
# the suite's 10-minute budget: one case per kind of refusal runs by default, the other points of a kind with -m slow
DATA_OPTIONS = ("tsv-", "hf-", "text-", "cifar-", "ljspeech-")  # the ids of the data cases start with these
DATA_CASES = [c for c in CASES if c[0].startswith(DATA_OPTIONS)]
SLOW = {"norm-placement-unknown", *(c[0] for c in DATA_CASES)}


@pytest.mark.parametrize("args,message,names", [
    pytest.param(*c[1:], id=c[0], marks=pytest.mark.slow if c[0] in SLOW else pytest.mark.skipif(
        c[0] == "ddp-without-gpu" and torch.cuda.is_available(), reason="this machine has a GPU")) for c in CASES])
def test_bad_input_is_one_line_and_exit_2(args, message, names, bad, tmp_path, cache_dir, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # it would show the traceback on purpose
    fill = lambda s: s.replace("{bad}", str(bad))  # noqa: E731
    out = run_cli([*FAST, *map(fill, args), f"hydra.run.dir={tmp_path}/run"], cache_dir, timeout=180)
    text = ANSI.sub("", out.stdout)
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and message in errors[0], text[-3000:]
    assert text.count(message) == 1, text[-3000:]  # said once, not also in a traceback or a wrapper's message
    for name in map(fill, names):
        assert name in errors[0], errors[0]
    assert not (tmp_path / "run").exists()  # refused before anything was written there: no folder left


# records which of torch and Lightning a train.py run imported, by the time it exits, into the file named first
PROBE = ("import atexit, runpy, sys\n"
         "out = sys.argv.pop(1)\n"
         "heavy = lambda: ' '.join(m for m in ('torch', 'lightning') if m in sys.modules)\n"
         "atexit.register(lambda: open(out, 'w').write(heavy()))\n"
         "sys.argv[0] = 'train.py'\n"
         "runpy.run_path('train.py', run_name='__main__')\n")
FULL_ERROR = {next(c[0] for c in DATA_CASES if c[0].startswith(p)) for p in DATA_OPTIONS}  # (each option's first)


@pytest.mark.parametrize("args,message,names,full_error", [
    pytest.param(*c[1:], full, id=f"{c[0]}{'-full-error' if full == '1' else ''}")
    for c in DATA_CASES for full in ("0", "1") if full == "0" or c[0] in FULL_ERROR])
def test_bad_data_is_refused_before_lightning(args, message, names, full_error, bad, tmp_path, cache_dir):
    """A bad data file is read by train.py's data preflight (attnlab.runs.data_check) before Lightning is imported:
    one line naming the file, exit 2, no run folder, with a logger on; with HYDRA_FULL_ERROR=1 the traceback too,
    still exit 2 and no folder. Neither torch nor Lightning is imported by then (the model-size check, which builds the
    net on torch's meta device, comes after the data's); nor does `datasets` (data=hf)."""
    marker = tmp_path / "imported"
    fill = lambda s: s.replace("{bad}", str(bad))  # noqa: E731
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "PYTEST_XDIST_WORKER")}
    env.update(ATTNLAB_CACHE=cache_dir, HF_DATASETS_CACHE=str(tmp_path / "datasets"), WANDB_SILENT="true",
               PYTHONUNBUFFERED="1", **({"HYDRA_FULL_ERROR": "1"} if full_error == "1" else {}))
    out = subprocess.run([sys.executable, "-c", PROBE, str(marker), "debug=fast", "logger=csv", *map(fill, args),
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    text = ANSI.sub("", out.stdout)
    assert out.returncode == 2, text[-3000:]
    assert ("Traceback" in text) == (full_error == "1"), text[-3000:]
    errors = [line for line in text.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and message in errors[0], text[-3000:]
    assert full_error == "1" or text.count(message) == 1, text[-3000:]  # (not also in a wrapper's message)
    for name in map(fill, names):
        assert name in errors[0], errors[0]
    assert not (tmp_path / "run").exists()  # refused before anything was written there: no folder left
    assert marker.read_text() == "", marker.read_text()  # neither torch nor Lightning: about a second of CPU


# ---------------------------------------------------------------------------------------------------------------
# The property over the space: every bad value of every config key kind is refused in one line (exit 2), before
# Lightning, leaving no folder. tests/bad_values.py generates the space from the composed configs (every leaf
# classified by type and name: seeds, sizes, rates, positive numbers, names that become folders or W&B fields,
# switches, interpolations on every leaf, +/++/~ on every part). All models' cases are checked in-process against
# the validator train.py runs (a bounded, deterministic sample: see bad_values.sample); one case per kind goes
# through a real `python train.py`, each with a run folder whose path has spaces, commas or parentheses, under
# each trainer (ddp_cpu included).


MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
# every model, then every option of the optimizer and LR-schedule groups (on the default model)
CHOICES = [f"model={m}" for m in MODELS] + [f"{group}={p.stem}" for group in ("optim", "sched")
                                            for p in sorted((CONF_DIR / group).glob("*.yaml"))]


def test_every_generated_bad_value_of_every_model_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(UNSET_ENV, raising=False)
    seen: set[str] = set()
    accepted, kinds = [], {}
    for choice in CHOICES:
        cfg = compose_train([choice], tmp_path / "out")
        for case in sample(cases_for(cfg, f"{choice}/"), seen):
            kinds[case.kind] = kinds.get(case.kind, 0) + 1
            try:
                validate_config(apply(cfg, case), case.overrides)
            except ConfigError as e:
                assert "\n" not in str(e), case.id
            else:
                accepted.append(case.id)
    assert not accepted, f"{len(accepted)} bad values accepted: {accepted[:30]}"
    # the space is what the generator says it is (a generator that found nothing would pass trivially)
    assert set(kinds) == {"seed", "size", "count", "rate", "positive", "name", "switch", "interpolation", "override"}, kinds
    assert sum(kinds.values()) > 400, kinds


def _representatives() -> list:
    """One generated case per kind of the default job (the first in generated order that needs no Lightning import
    to be judged), plus a width that cannot be allocated."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["paths.output_dir=/nonexistent"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    picked: dict[str, object] = {}
    for case in cases_for(cfg):
        key = case.overrides[0].lstrip("+~").split("=")[0]
        if case.kind not in picked and not key.startswith(("callbacks", "trainer", "logger", "model.net")):
            picked[case.kind] = case
        if case.overrides[0].endswith("=10000000") and "memory" not in picked:
            picked["memory"] = case
    GlobalHydra.instance().clear()
    return list(picked.items())


# each refused run also carries a run folder path that Hydra and the shell must read as one path, and a trainer
RUN_DIRS = ["a b/run", "x,y/run", "(p) q, r/run"]
TRAINERS = ["trainer=cpu", "trainer=default", "trainer=ddp_cpu"]
EXTRA = [  # issue cases the kinds do not produce as such
    ("cache-under-a-file", ["paths.cache_dir={root}/../a_file/cache"]),
    ("hydra-plus-on-existing-key", ["+model.net.d_model=5"]),
]


# kinds the validator reports together (every bad single value named in its one line): one train.py run for all
TOGETHER = ("seed", "size", "count", "rate", "positive", "name", "switch")


def _train_cases():
    cases = _representatives()
    together = [c for label, c in cases if label in TOGETHER]
    reps = [("+".join(c.kind for c in together), [o for c in together for o in c.overrides])]
    reps += [(f"{label}:{c.id}", list(c.overrides)) for label, c in cases if label not in TOGETHER] + EXTRA
    return [pytest.param(ov, TRAINERS[i % 3], RUN_DIRS[i % 3], id=f"{cid}-{TRAINERS[i % 3]}")
            for i, (cid, ov) in enumerate(reps)]


def _run(script: str, args: list[str], root: Path, stdin: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNLAB_CACHE", "HYDRA_FULL_ERROR", UNSET_ENV,
                                                            "PYTEST_XDIST_WORKER")}
    env.update(ATTNLAB_ROOT=str(root), WANDB_SILENT="true", PYTHONUNBUFFERED="1")
    return run_python([sys.executable, script, *args], cwd=ROOT, env=env, input=stdin, text=True, timeout=300,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _assert_one_line_refusal(out: subprocess.CompletedProcess, root: Path) -> str:
    text = ANSI.sub("", out.stdout)
    lines = [line for line in text.splitlines() if line.strip()]
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text and len(lines) == 1, text[-3000:]
    assert sorted(p.name for p in root.iterdir()) == [], sorted(map(str, root.rglob("*")))[:10]  # nothing new
    return lines[0]


@pytest.mark.parametrize("overrides,trainer,run_dir", _train_cases())
def test_generated_bad_values_through_train_py(overrides, trainer, run_dir, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "a_file").write_text("not a folder\n")
    args = [o.replace("{root}", str(root)) for o in overrides]
    out = _run("train.py", [*args, trainer, f"hydra.run.dir={hydra_value(root / 'outputs' / run_dir)}"], root)
    line = _assert_one_line_refusal(out, root)
    for arg in args:  # the line names every bad key
        key = arg.lstrip("+~").split("=")[0]
        assert key.split(".")[-1] in line or "model.net has" in line, (key, line)


def test_values_refused_before_torch_is_imported(tmp_path):
    """A command line refused for its values answers before torch and Lightning are imported (about 1.5 s of CPU
    instead of 5 on a small machine): the checks take their option lists from the torch-free attnlab.core.choices."""
    marker = tmp_path / "imported"
    out = subprocess.run([sys.executable, "-c", PROBE, str(marker), "seed=-1", "model.net.n_heads=0", "task_name=nan",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=120)
    assert out.returncode == 2 and "seed=-1" in out.stdout, out.stdout[-3000:]
    assert marker.read_text() == "", marker.read_text()


def _cli_config(name: str, overrides=()):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(name, overrides=list(overrides), return_hydra_config=True)


CLI_REQUIRED = {"translate": ["ckpt=/nonexistent/last.ckpt"], "generate": ["ckpt=/nonexistent/last.ckpt"],
                "synthesize": ["ckpt=/nonexistent/last.ckpt", "text=hi"]}


def _cli_checks(name: str):
    from attnlab.cli import generate, synthesize, translate

    if name == "generate":
        return lambda cfg: (generate.checkpoint_option(cfg), generate.check_options(cfg))
    return {"translate": translate.check_options, "synthesize": synthesize.check_options}[name]


@pytest.mark.parametrize("name", ["translate", "generate", "synthesize"])
def test_every_generated_bad_option_of_each_cli_is_refused(name, tmp_path, monkeypatch):
    """In-process, the checks each command runs before reading a checkpoint: RunFolderCheck's (interpolations,
    task_name, +/~ overrides) and the command's own option checks."""
    from omegaconf import OmegaConf, read_write

    from attnlab.runs.folder import _task_config_problem

    monkeypatch.delenv(UNSET_ENV, raising=False)
    base = _cli_config(name, CLI_REQUIRED[name])
    check = _cli_checks(name)
    accepted = []
    cases = cli_cases(base, name)
    for case in cases:
        cfg = apply(base, case)
        with read_write(cfg), open_dict(cfg):
            cfg.hydra.overrides.task = [*CLI_REQUIRED[name], *case.overrides]
        problem = _task_config_problem(cfg, tmp_path / "run")
        if problem is None:
            task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            try:
                check(task)
            except UserError as e:
                problem = str(e)
        if problem is None:
            accepted.append(case.id)
    GlobalHydra.instance().clear()
    assert not accepted, accepted
    assert len(cases) > 20


def _cli_representatives():
    out = []
    for i, name in enumerate(["translate", "generate", "synthesize"]):
        cases = cli_cases(_cli_config(name, CLI_REQUIRED[name]), name)
        # one case each, a different kind per command (all kinds are checked in-process above)
        case = next(c for c in cases if c.kind == ("override", "name", "interpolation")[i])
        out.append(pytest.param(name, list(case.overrides), RUN_DIRS[i], id=case.id))
    GlobalHydra.instance().clear()
    return out


@pytest.mark.parametrize("name,overrides,run_dir", _cli_representatives())
def test_generated_bad_options_through_each_cli(name, overrides, run_dir, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    out = _run(f"{name}.py", [*CLI_REQUIRED[name], *overrides,
                              f"hydra.run.dir={hydra_value(root / 'outputs' / run_dir)}"], root, stdin="one\n")
    line = _assert_one_line_refusal(out, root)
    assert overrides[0].lstrip("+~").split("=")[0] in line, line


def test_a_refused_or_failed_inference_call_leaves_no_run_folder(tmp_path):
    """An inference command writes a run folder only if it writes output there: a missing checkpoint (refused
    after the options passed, inside the job) leaves outputs/<task>/ absent."""
    root = tmp_path / "root"
    root.mkdir()
    out = _run("translate.py", ["ckpt=/nonexistent/last.ckpt"], root, stdin="one\n")
    assert "checkpoint not found" in _assert_one_line_refusal(out, root)
